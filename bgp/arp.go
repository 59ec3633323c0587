package bgp

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// LinkSubnets is one interface's IPv4 subnets and ARP sysctls, as read by
// ARPWarnings. Values are the effective ones: max(all, interface).
type LinkSubnets struct {
	Name        string
	Subnets     []netip.Prefix
	ARPIgnore   int
	ARPAnnounce int
}

// arpWarnings is the pure rule. A VIP bound on lo that also lies inside a
// subnet connected on another interface is answered by Linux's default ARP
// (arp_ignore=0: reply for any local address on any interface), so hosts on
// that segment send VIP traffic straight to whichever node answered last,
// bypassing the router's ECMP; and with arp_announce below 2 the node may
// announce the VIP as the sender of its own ARP requests. vipd does not
// change these host-wide settings itself (they affect every address on the
// node); it says what to set.
func arpWarnings(vips []netip.Prefix, links []LinkSubnets) []string {
	var out []string
	for _, v := range vips {
		a := v.Addr()
		if !a.Is4() {
			continue // IPv6 neighbour discovery answers only for addresses on the receiving interface
		}
		for _, l := range links {
			for _, s := range l.Subnets {
				if !s.Contains(a) || (l.ARPIgnore >= 1 && l.ARPAnnounce >= 2) {
					continue
				}
				out = append(out, fmt.Sprintf(
					"VIP %s is inside %s on %s, where arp_ignore=%d arp_announce=%d: hosts on that segment can reach the VIP without the router. "+
						"Set net.ipv4.conf.all.arp_ignore=1 and net.ipv4.conf.all.arp_announce=2 (see docs/bgp.md)", a, s, l.Name, l.ARPIgnore, l.ARPAnnounce))
			}
		}
	}
	return out
}

// ARPWarnings checks the node's interfaces (this network namespace) for
// the problem arpWarnings describes. Errors reading an interface skip it.
func ARPWarnings(vips []netip.Prefix) []string {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	allIgnore, allAnnounce := readSysctl("all", "arp_ignore"), readSysctl("all", "arp_announce")
	var links []LinkSubnets
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		l := LinkSubnets{Name: ifc.Name,
			ARPIgnore:   max(allIgnore, readSysctl(ifc.Name, "arp_ignore")),
			ARPAnnounce: max(allAnnounce, readSysctl(ifc.Name, "arp_announce"))}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				ip, ok := netip.AddrFromSlice(ipn.IP)
				ones, _ := ipn.Mask.Size()
				if ok && ip.Unmap().Is4() {
					l.Subnets = append(l.Subnets, netip.PrefixFrom(ip.Unmap(), ones).Masked())
				}
			}
		}
		links = append(links, l)
	}
	return arpWarnings(vips, links)
}

func readSysctl(iface, key string) int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + iface + "/" + key)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}
