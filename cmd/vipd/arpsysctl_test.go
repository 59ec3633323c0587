package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestARPSysctlWarnings(t *testing.T) {
	one := []hostLink{{Name: "lo", Up: true, IPv4: true, Loop: true}, {Name: "eth0", Up: true, IPv4: true}}
	two := append(one[:2:2], hostLink{Name: "eth1", Up: true, IPv4: true})
	down := append(one[:2:2], hostLink{Name: "eth1", IPv4: true})
	noIPv4 := append(one[:2:2], hostLink{Name: "eth1", Up: true})
	cases := []struct {
		name      string
		links     []hostLink
		all, eth0 [2]string // arp_ignore, arp_announce ("" absent)
		want      []string  // substrings, one per warning
	}{
		{"one interface: the sysctls do not matter", one, [2]string{"0", "0"}, [2]string{"0", "0"}, nil},
		{"a second interface down or without IPv4: nothing", down, [2]string{"0", "0"}, [2]string{"0", "0"}, nil},
		{"second interface without IPv4", noIPv4, [2]string{"0", "0"}, [2]string{"0", "0"}, nil},
		{"multi-homed with the defaults: both", two, [2]string{"0", "0"}, [2]string{"0", "0"}, []string{"arp_ignore is 0", "arp_announce is 0"}},
		{"set on all", two, [2]string{"1", "2"}, [2]string{"0", "0"}, nil},
		{"set on the VIP interface only (the maximum counts)", two, [2]string{"0", "0"}, [2]string{"2", "2"}, nil},
		{"arp_announce 1 is not enough", two, [2]string{"1", "1"}, [2]string{"0", "0"}, []string{"arp_announce is 1"}},
		{"unreadable (not Linux, no /proc): nothing", two, [2]string{"", ""}, [2]string{"", ""}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for iface, vals := range map[string][2]string{"all": tc.all, "eth0": tc.eth0} {
				d := filepath.Join(dir, "net", "ipv4", "conf", iface)
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				for i, key := range []string{"arp_ignore", "arp_announce"} {
					if vals[i] != "" {
						if err := os.WriteFile(filepath.Join(d, key), []byte(vals[i]+"\n"), 0o644); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			got := arpSysctlWarnings("eth0", tc.links, dir)
			if len(got) != len(tc.want) {
				t.Fatalf("got %q, want %d warnings", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) || !strings.Contains(got[i], "docs/l2.md") {
					t.Errorf("warning %d %q lacks %q", i, got[i], w)
				}
			}
		})
	}
}
