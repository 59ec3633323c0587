package vip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/vip/conflict"
)

// Batch operations for pool addresses (package pools): thousands of
// addresses are probed on one socket, listed with one netlink dump and
// announced from one socket, instead of one operation each. Pool
// addresses are host addresses (/32, /128) bound in vipd's form (label
// IFNAME:vipd for IPv4, nodad for IPv6).

// ProbeMany sends a conflict probe (ARP probe / neighbour solicitation) for
// every address and waits the probe timeout once for answers. It returns
// the MAC of another host answering, by address; addresses absent from the
// map got no answer. Answers from our own MAC never count.
func (l *L2) ProbeMany(ctx context.Context, addrs []netip.Addr) (map[netip.Addr]string, error) {
	if l.probeTimeout <= 0 {
		return map[netip.Addr]string{}, nil
	}
	return l.probeMany(ctx, addrs, l.probeTimeout)
}

// probeMany is ProbeMany waiting wait for the answers.
func (l *L2) probeMany(ctx context.Context, addrs []netip.Addr, wait time.Duration) (map[netip.Addr]string, error) {
	out := map[netip.Addr]string{}
	if len(addrs) == 0 {
		return out, nil
	}
	_, ifi, err := l.upLink()
	if err != nil {
		return nil, err
	}
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	errc := make(chan error, 2)
	res4, res6 := map[netip.Addr]string{}, map[netip.Addr]string{}
	go func() { errc <- l.arpProbeMany(ifi, v4, deadline, res4) }()
	go func() { errc <- l.ndpProbeMany(ifi, v6, deadline, res6) }()
	err = errors.Join(<-errc, <-errc)
	for a, m := range res4 {
		out[a] = m
	}
	for a, m := range res6 {
		out[a] = m
	}
	// Not counted as conflicts here: during a hand-over the previous
	// holder answers until it releases. The caller decides.
	return out, err
}

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

func (l *L2) arpProbeMany(ifi *net.Interface, addrs []netip.Addr, deadline time.Time, out map[netip.Addr]string) error {
	if len(addrs) == 0 {
		return nil
	}
	c, err := arp.Dial(ifi)
	if err != nil {
		return fmt.Errorf("ARP probe on %s: %w", ifi.Name, err)
	}
	defer c.Close()
	want := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		want[a] = true
		p, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, netip.IPv4Unspecified(), make(net.HardwareAddr, 6), a)
		if err != nil {
			return err
		}
		if err := c.WriteTo(p, ethernet.Broadcast); err != nil {
			return fmt.Errorf("ARP probe for %s: %w", a, err)
		}
	}
	if err := c.SetReadDeadline(deadline); err != nil {
		return err
	}
	for {
		r, eth, err := c.Read()
		if err != nil {
			if isTimeout(err) {
				return nil
			}
			return fmt.Errorf("ARP probe: %w", err)
		}
		if r == nil || !want[r.SenderIP] {
			continue
		}
		if mac := arpClaim(r, eth, r.SenderIP, ifi.HardwareAddr); mac != nil {
			if own, err := l.ownMAC(mac, r.SenderIP); err != nil {
				return fmt.Errorf("ARP probe: %w", err)
			} else if !own {
				out[r.SenderIP] = mac.String()
			}
		}
	}
}

func (l *L2) ndpProbeMany(ifi *net.Interface, addrs []netip.Addr, deadline time.Time, out map[netip.Addr]string) error {
	if len(addrs) == 0 {
		return nil
	}
	rc, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_IPV6, &packet.Config{Filter: naFilter})
	if err != nil {
		return fmt.Errorf("neighbour probe on %s: %w", ifi.Name, err)
	}
	defer rc.Close()
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		c, _, err = ndp.Listen(ifi, ndp.Unspecified)
	}
	if err != nil {
		return fmt.Errorf("neighbour probe on %s: %w", ifi.Name, err)
	}
	defer c.Close()
	want := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		want[a] = true
		snm, err := ndp.SolicitedNodeMulticast(a)
		if err != nil {
			return err
		}
		ns := &ndp.NeighborSolicitation{TargetAddress: a,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}}}
		if err := c.WriteTo(ns, nil, snm); err != nil {
			return fmt.Errorf("neighbour probe for %s: %w", a, err)
		}
	}
	if err := rc.SetReadDeadline(deadline); err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		n, _, err := rc.ReadFrom(buf)
		if err != nil {
			if isTimeout(err) {
				return nil
			}
			return fmt.Errorf("neighbour probe: %w", err)
		}
		const eth, ip6 = 14, 40
		if n < eth+ip6+4 {
			continue
		}
		m, err := ndp.ParseMessage(buf[eth+ip6 : n])
		if err != nil {
			continue
		}
		na, ok := m.(*ndp.NeighborAdvertisement)
		if !ok || !want[na.TargetAddress] {
			continue
		}
		if mac := naClaim(buf[:n], na.TargetAddress, ifi.HardwareAddr); mac != nil {
			if own, err := l.ownMAC(mac, na.TargetAddress); err != nil {
				return fmt.Errorf("neighbour probe: %w", err)
			} else if !own {
				out[na.TargetAddress] = mac.String()
			}
		}
	}
}

// BindMany binds host addresses in vipd's form without probing (the
// caller probed them with ProbeMany). It returns an error per address that
// could not be bound; on a link that is down or goes down meanwhile every
// address fails with ErrLinkDown and none is left bound.
func (l *L2) BindMany(ctx context.Context, addrs []netip.Addr) map[netip.Addr]error {
	errs := map[netip.Addr]error{}
	link, _, err := l.upLink()
	if err != nil {
		for _, a := range addrs {
			errs[a] = err
		}
		return errs
	}
	for _, a := range addrs {
		if err := netlink.AddrReplace(link, l.addr(hostPrefix(a))); err != nil {
			errs[a] = fmt.Errorf("bind %s on %s: %w", a, l.ifname, err)
		}
	}
	if _, _, err := l.upLink(); err != nil {
		for _, a := range addrs {
			errs[a] = err
		}
		_, _ = l.ReleaseMany(context.Background(), addrs)
		return errs
	}
	// Bound: guarded against foreign claims like the VIPs (l2guard.go).
	for _, a := range addrs {
		if errs[a] == nil {
			l.guardStep(ctx, conflict.Bound{Addr: a.Unmap()})
		}
	}
	return errs
}

// ReleaseMany removes every entry of each address from the interface
// (whatever its prefix length or label), with one listing before and one
// after; it returns the addresses still bound after that.
func (l *L2) ReleaseMany(ctx context.Context, addrs []netip.Addr) ([]netip.Addr, error) {
	if len(addrs) == 0 {
		return nil, nil
	}
	for _, a := range addrs {
		l.guardStep(ctx, conflict.Unbound{Addr: a.Unmap()})
	}
	link, err := l.lookup()
	if link == nil {
		if errors.Is(err, ErrLinkDown) {
			return nil, nil
		}
		return addrs, err
	}
	want := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		want[a.Unmap()] = true
	}
	all, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return addrs, fmt.Errorf("list addresses on %s: %w", link.Attrs().Name, err)
	}
	var errs []error
	for i := range all {
		ip, ok := netip.AddrFromSlice(all[i].IP)
		if !ok || !want[ip.Unmap()] {
			continue
		}
		if err := netlink.AddrDel(link, &all[i]); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("remove %s: %w", all[i].IPNet, err))
		}
	}
	left, err := l.boundAmong(link, want)
	if err != nil {
		return addrs, err
	}
	return left, errors.Join(errs...)
}

// BoundMany returns which of addrs are bound on the interface now, in any
// form, usable (not tentative or dadfailed): one netlink listing.
func (l *L2) BoundMany(_ context.Context, addrs []netip.Addr) ([]netip.Addr, error) {
	link, err := l.lookup()
	if link == nil {
		if errors.Is(err, ErrLinkDown) {
			return nil, nil
		}
		return nil, err
	}
	want := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		want[a.Unmap()] = true
	}
	return l.boundAmong(link, want)
}

func (l *L2) boundAmong(link netlink.Link, want map[netip.Addr]bool) ([]netip.Addr, error) {
	all, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses on %s: %w", link.Attrs().Name, err)
	}
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	for _, a := range all {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if want[ip] && !seen[ip] && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
			seen[ip] = true
			out = append(out, ip)
		}
	}
	return out, nil
}

// AnnounceMany sends gratuitous ARP (Request and Reply) for every IPv4
// address and an unsolicited neighbour advertisement for every IPv6 one,
// from one socket per family. It returns how many frames it sent.
func (l *L2) AnnounceMany(_ context.Context, addrs []netip.Addr) (int, error) {
	_, ifi, err := l.upLink()
	if err != nil {
		return 0, err
	}
	sent := 0
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	var errs []error
	if len(v4) > 0 {
		c, err := arp.Dial(ifi)
		if err != nil {
			return 0, fmt.Errorf("gratuitous ARP on %s: %w", ifi.Name, err)
		}
		for _, a := range v4 {
			for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
				p, err := arp.NewPacket(op, ifi.HardwareAddr, a, ethernet.Broadcast, a)
				if err == nil {
					err = c.WriteTo(p, ethernet.Broadcast)
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("gratuitous ARP for %s: %w", a, err))
					continue
				}
				sent++
			}
		}
		c.Close()
	}
	if len(v6) > 0 {
		c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
		if err != nil {
			return sent, fmt.Errorf("neighbour advertisement on %s: %w", ifi.Name, err)
		}
		for _, a := range v6 {
			na := &ndp.NeighborAdvertisement{Override: true, TargetAddress: a,
				Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ifi.HardwareAddr}}}
			if err := c.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes()); err != nil {
				errs = append(errs, fmt.Errorf("neighbour advertisement for %s: %w", a, err))
				continue
			}
			sent++
		}
		c.Close()
	}
	return sent, errors.Join(errs...)
}

// Labelled returns the IPv4 addresses bound on the interface with vipd's
// label (VIPs and pool addresses as vipd binds them), for `vipd cleanup`.
// It returns none when the label is the interface's own name (an
// interface name too long for "NAME:vipd"): vipd's entries cannot be told
// from the node's own then.
func (l *L2) Labelled() ([]netip.Addr, error) {
	if l.label == l.ifname {
		return nil, nil
	}
	link, err := l.lookup()
	if link == nil {
		if errors.Is(err, ErrLinkDown) {
			return nil, nil
		}
		return nil, err
	}
	all, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list addresses on %s: %w", l.ifname, err)
	}
	var out []netip.Addr
	for _, a := range all {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && a.Label == l.label {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
