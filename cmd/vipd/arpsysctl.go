package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// hostLink is what the ARP sysctl check needs of one interface.
type hostLink struct {
	Name string
	Up   bool
	IPv4 bool // has an IPv4 address
	Loop bool
}

// hostLinks lists this host's interfaces.
func hostLinks() ([]hostLink, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]hostLink, 0, len(ifs))
	for _, i := range ifs {
		l := hostLink{Name: i.Name, Up: i.Flags&net.FlagUp != 0, Loop: i.Flags&net.FlagLoopback != 0}
		if addrs, err := i.Addrs(); err == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
					l.IPv4 = true
				}
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// arpSysctlWarnings explains where the ARP sysctls of a multi-homed node
// (another interface up with an IPv4 address besides the VIP's) work
// against an l2 VIP; nil on a node with one interface, where they do not
// matter. procSys is /proc/sys (tests pass a directory of their own).
//
// Linux answers ARP for any local address on every interface
// (arp_ignore 0), so the VIP is answered from every NIC: clients may send
// to the VIP through a NIC other than VIPD_INTERFACE, and hosts on the
// other segments reach the VIP through this node ("ARP flux"). With
// arp_announce below 2, ARP requests sent from another NIC may carry the
// VIP (the source of a reply the apiserver sends from it) as sender address,
// moving the neighbours' entry for the VIP to that NIC's MAC. Both are
// effective as the maximum of conf/all and conf/IFACE.
func arpSysctlWarnings(vipIface string, links []hostLink, procSys string) []string {
	multi := false
	for _, l := range links {
		if l.Name != vipIface && l.Up && l.IPv4 && !l.Loop {
			multi = true
		}
	}
	if !multi {
		return nil
	}
	read := func(iface, key string) (int, bool) {
		b, err := os.ReadFile(filepath.Join(procSys, "net", "ipv4", "conf", iface, key))
		if err != nil {
			return 0, false
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		return n, err == nil
	}
	effective := func(key string) (int, bool) {
		all, ok1 := read("all", key)
		one, ok2 := read(vipIface, key)
		if !ok1 && !ok2 {
			return 0, false
		}
		return max(all, one), true
	}
	var out []string
	if v, ok := effective("arp_ignore"); ok && v < 1 {
		out = append(out, fmt.Sprintf("net.ipv4.conf.all.arp_ignore is %d on a node with more than one interface: every interface answers ARP for the VIP (clients may reach it through another NIC, hosts on other segments through this node); set net.ipv4.conf.all.arp_ignore=1 (docs/l2.md, \"Nodes with more than one interface\")", v))
	}
	if v, ok := effective("arp_announce"); ok && v < 2 {
		out = append(out, fmt.Sprintf("net.ipv4.conf.all.arp_announce is %d on a node with more than one interface: ARP requests from another NIC may name the VIP as their sender and move the neighbours' entry for it to that NIC; set net.ipv4.conf.all.arp_announce=2 (docs/l2.md, \"Nodes with more than one interface\")", v))
	}
	return out
}
