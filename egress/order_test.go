package egress

import (
	"net/netip"
	"slices"
	"testing"
)

// TestExtendOrder: runtime egress IPs get a slot without moving any IP
// still in use; a freed slot after the fixed ones is reused, the fixed ones
// never.
func TestExtendOrder(t *testing.T) {
	a := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, x := range s {
			out = append(out, netip.MustParseAddr(x))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		order []netip.Addr
		fixed int
		used  []netip.Addr
		want  []netip.Addr
	}{
		{"nothing new", a("10.0.0.1", "10.0.0.2"), 2, a("10.0.0.2"), a("10.0.0.1", "10.0.0.2")},
		{"appended after the fixed", a("10.0.0.1"), 1, a("10.0.0.9", "10.0.0.8"), a("10.0.0.1", "10.0.0.9", "10.0.0.8")},
		{"fixed unused slot is not taken", a("10.0.0.1", "10.0.0.2"), 2, a("10.0.0.9"), a("10.0.0.1", "10.0.0.2", "10.0.0.9")},
		{"freed runtime slot reused", a("10.0.0.1", "10.0.0.9", "10.0.0.8"), 1, a("10.0.0.8", "10.0.0.7"), a("10.0.0.1", "10.0.0.7", "10.0.0.8")},
		{"in use keeps its slot", a("10.0.0.1", "10.0.0.9", "10.0.0.8"), 1, a("10.0.0.9", "10.0.0.8", "fd00::9"), a("10.0.0.1", "10.0.0.9", "10.0.0.8", "fd00::9")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.order)
			got := ExtendOrder(tc.order, tc.fixed, tc.used)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			if !slices.Equal(tc.order, before) {
				t.Fatalf("the input was modified: %v", tc.order)
			}
		})
	}
}
