package v1alpha1

import (
	"net/netip"
	"regexp"
	"testing"
)

// dnsSubdomain is the API server's rule for cluster-scoped object names.
var dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func TestAllocationName(t *testing.T) {
	for _, tc := range []struct{ addr, name string }{
		{"192.0.2.7", "192.0.2.7"},
		{"0.0.0.0", "0.0.0.0"},
		{"::ffff:192.0.2.7", "192.0.2.7"},
		{"2001:db8::7", "2001-0db8-0000-0000-0000-0000-0000-0007"},
		{"::1", "0000-0000-0000-0000-0000-0000-0000-0001"},
		{"FD00::ABCD", "fd00-0000-0000-0000-0000-0000-0000-abcd"},
	} {
		got, err := AllocationName(netip.MustParseAddr(tc.addr))
		if err != nil || got != tc.name {
			t.Errorf("AllocationName(%s) = %q, %v; want %q", tc.addr, got, err, tc.name)
			continue
		}
		if !dnsSubdomain.MatchString(got) || len(got) > 253 {
			t.Errorf("AllocationName(%s) = %q is not a valid object name", tc.addr, got)
		}
		back, err := AddressOfName(got)
		if err != nil || back != netip.MustParseAddr(tc.addr).Unmap() {
			t.Errorf("AddressOfName(%q) = %v, %v; want %s", got, back, err, tc.addr)
		}
	}
	if _, err := AllocationName(netip.MustParseAddr("fe80::1%eth0")); err == nil {
		t.Error("an address with a zone got a name")
	}
	if _, err := AllocationName(netip.Addr{}); err == nil {
		t.Error("the zero address got a name")
	}
	for _, bad := range []string{"", "web", "2001-db8-0-0-0-0-0-7", "0000-0000-0000-0000-0000-ffff-c000-0207", "gggg-0000-0000-0000-0000-0000-0000-0001"} {
		if a, err := AddressOfName(bad); err == nil {
			t.Errorf("AddressOfName(%q) = %v, want an error", bad, a)
		}
	}
}
