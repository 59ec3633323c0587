package bgp

import (
	"net/netip"
	"strings"
	"testing"
)

func TestARPWarnings(t *testing.T) {
	lan := LinkSubnets{Name: "eth0", Subnets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}}
	tuned := lan
	tuned.ARPIgnore, tuned.ARPAnnounce = 1, 2
	halfTuned := lan
	halfTuned.ARPIgnore = 1
	in := netip.MustParsePrefix("10.0.0.100/32")
	out := netip.MustParsePrefix("198.51.100.10/32")
	v6 := netip.MustParsePrefix("fd00::100/128")
	tests := []struct {
		name  string
		vips  []netip.Prefix
		links []LinkSubnets
		want  int
	}{
		{"VIP outside every subnet", []netip.Prefix{out}, []LinkSubnets{lan}, 0},
		{"VIP in the LAN, defaults", []netip.Prefix{in}, []LinkSubnets{lan}, 1},
		{"VIP in the LAN, tuned", []netip.Prefix{in}, []LinkSubnets{tuned}, 0},
		{"VIP in the LAN, arp_announce left at 0", []netip.Prefix{in}, []LinkSubnets{halfTuned}, 1},
		{"IPv6 VIP never", []netip.Prefix{v6}, []LinkSubnets{lan}, 0},
	}
	for _, tt := range tests {
		got := arpWarnings(tt.vips, tt.links)
		if len(got) != tt.want {
			t.Errorf("%s: %d warnings %q, want %d", tt.name, len(got), got, tt.want)
		}
		for _, w := range got {
			if !strings.Contains(w, "arp_ignore=1") || !strings.Contains(w, "eth0") {
				t.Errorf("%s: warning lacks the fix or the interface: %q", tt.name, w)
			}
		}
	}
}
