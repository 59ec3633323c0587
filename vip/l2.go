package vip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrConflict means another host answered for the VIP before we bound it.
var ErrConflict = errors.New("another host answers for the VIP")

// ConflictError names who answered.
type ConflictError struct {
	VIP netip.Addr
	MAC net.HardwareAddr
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%v: %s is answered by %s", ErrConflict, e.VIP, e.MAC)
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

// L2 binds VIPs on an interface and announces them with gratuitous ARP
// (IPv4) and unsolicited neighbour advertisements (IPv6).
//
// Before binding an address that is not already present it probes for it
// (an RFC 5227 ARP probe, or a duplicate-address neighbour solicitation) and
// refuses to bind if another MAC answers. Because of that probe, IPv6 VIPs
// are added with IFA_F_NODAD: they are usable at once and can never be left
// tentative or dadfailed. Addresses are added with preferred_lft 0 so the
// kernel never picks a VIP as a source address.
type L2 struct {
	ifname       string
	label        string
	probeTimeout time.Duration
	log          *slog.Logger
	announced    *prometheus.CounterVec
	conflicts    *prometheus.CounterVec
}

// L2Options shape an L2 announcer.
type L2Options struct {
	Interface string
	// ProbeTimeout is how long to wait for an answer to the conflict probe.
	// Zero disables the probe.
	ProbeTimeout time.Duration
}

// NewL2 checks the interface and returns an announcer for it.
func NewL2(opts L2Options, log *slog.Logger, reg prometheus.Registerer) (*L2, error) {
	if _, err := net.InterfaceByName(opts.Interface); err != nil {
		return nil, fmt.Errorf("VIPD_INTERFACE %q: %w", opts.Interface, err)
	}
	label := opts.Interface + ":vipd"
	if len(label) > 15 {
		label = opts.Interface
	}
	l := &L2{
		ifname: opts.Interface, label: label, probeTimeout: opts.ProbeTimeout, log: log,
		announced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_announcements_total", Help: "Gratuitous ARP and unsolicited neighbour advertisements sent, by VIP and kind.",
		}, []string{"vip", "kind"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_conflicts_total", Help: "Times another host answered the probe for a VIP before binding it.",
		}, []string{"vip"}),
	}
	if reg != nil {
		if err := reg.Register(l.announced); err != nil {
			return nil, err
		}
		if err := reg.Register(l.conflicts); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// DefaultInterface returns the interface of the IPv4 default route, or of
// the IPv6 one when there is no IPv4 default.
func DefaultInterface() (string, error) {
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlink.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return "", fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) && r.LinkIndex > 0 {
				link, err := netlink.LinkByIndex(r.LinkIndex)
				if err != nil {
					return "", err
				}
				return link.Attrs().Name, nil
			}
		}
	}
	return "", errors.New("no default route: set VIPD_INTERFACE")
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

func (l *L2) link() (netlink.Link, *net.Interface, error) {
	link, err := netlink.LinkByName(l.ifname)
	if err != nil {
		return nil, nil, fmt.Errorf("interface %s: %w", l.ifname, err)
	}
	ifi, err := net.InterfaceByName(l.ifname)
	if err != nil {
		return nil, nil, fmt.Errorf("interface %s: %w", l.ifname, err)
	}
	return link, ifi, nil
}

func (l *L2) addr(vip netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{
		IPNet:       &net.IPNet{IP: net.IP(vip.Addr().AsSlice()), Mask: net.CIDRMask(vip.Bits(), vip.Addr().BitLen())},
		PreferedLft: 0,
		ValidLft:    math.MaxUint32, // forever
	}
	if vip.Addr().Is4() {
		a.Label = l.label
	} else {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

// Acquire probes for the VIP (unless it is already bound) and binds it.
func (l *L2) Acquire(ctx context.Context, vip netip.Prefix) error {
	link, ifi, err := l.link()
	if err != nil {
		return err
	}
	present, err := l.present(link, vip)
	if err != nil {
		return err
	}
	if !present && l.probeTimeout > 0 {
		if err := l.probe(ctx, ifi, vip.Addr()); err != nil {
			if errors.Is(err, ErrConflict) {
				l.conflicts.WithLabelValues(vip.String()).Inc()
			}
			return err
		}
	}
	if err := netlink.AddrReplace(link, l.addr(vip)); err != nil {
		return fmt.Errorf("bind %s on %s: %w", vip, l.ifname, err)
	}
	return nil
}

// Release removes the VIP from the interface.
func (l *L2) Release(_ context.Context, vip netip.Prefix) error {
	link, err := netlink.LinkByName(l.ifname)
	if err != nil {
		return fmt.Errorf("interface %s: %w", l.ifname, err)
	}
	if err := netlink.AddrDel(link, l.addr(vip)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("remove %s from %s: %w", vip, l.ifname, err)
	}
	return nil
}

// Present reports whether the VIP is bound and usable (not tentative or
// dadfailed) on the interface.
func (l *L2) Present(_ context.Context, vip netip.Prefix) (bool, error) {
	link, err := netlink.LinkByName(l.ifname)
	if err != nil {
		return false, fmt.Errorf("interface %s: %w", l.ifname, err)
	}
	return l.present(link, vip)
}

func (l *L2) present(link netlink.Link, vip netip.Prefix) (bool, error) {
	family := netlink.FAMILY_V4
	if vip.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(link, family)
	if err != nil {
		return false, fmt.Errorf("list addresses on %s: %w", l.ifname, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap() != vip.Addr() {
			continue
		}
		if a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
			return false, nil
		}
		return true, nil
	}
	return false, nil
}

// Announce sends gratuitous ARP (Request and Reply) for an IPv4 VIP or an
// unsolicited neighbour advertisement with the Override flag for IPv6.
func (l *L2) Announce(_ context.Context, vip netip.Prefix) error {
	_, ifi, err := l.link()
	if err != nil {
		return err
	}
	if vip.Addr().Is4() {
		return l.garp(ifi, vip.Addr())
	}
	return l.unsolicitedNA(ifi, vip.Addr())
}

func (l *L2) garp(ifi *net.Interface, vip netip.Addr) error {
	c, err := arp.Dial(ifi)
	if err != nil {
		return fmt.Errorf("gratuitous ARP on %s: %w", ifi.Name, err)
	}
	defer c.Close()
	for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
		p, err := arp.NewPacket(op, ifi.HardwareAddr, vip, ethernet.Broadcast, vip)
		if err != nil {
			return fmt.Errorf("gratuitous ARP for %s: %w", vip, err)
		}
		if err := c.WriteTo(p, ethernet.Broadcast); err != nil {
			return fmt.Errorf("gratuitous ARP for %s on %s: %w", vip, ifi.Name, err)
		}
		kind := "garp_request"
		if op == arp.OperationReply {
			kind = "garp_reply"
		}
		l.announced.WithLabelValues(netip.PrefixFrom(vip, 32).String(), kind).Inc()
	}
	return nil
}

func (l *L2) unsolicitedNA(ifi *net.Interface, vip netip.Addr) error {
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return fmt.Errorf("neighbour advertisement on %s: %w", ifi.Name, err)
	}
	defer c.Close()
	na := &ndp.NeighborAdvertisement{
		Override:      true,
		TargetAddress: vip,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ifi.HardwareAddr}},
	}
	if err := c.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes()); err != nil {
		return fmt.Errorf("neighbour advertisement for %s on %s: %w", vip, ifi.Name, err)
	}
	l.announced.WithLabelValues(netip.PrefixFrom(vip, 128).String(), "na").Inc()
	return nil
}

// probe asks whether anybody already answers for vip; ErrConflict if so.
func (l *L2) probe(ctx context.Context, ifi *net.Interface, vip netip.Addr) error {
	deadline := time.Now().Add(l.probeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var mac net.HardwareAddr
	var err error
	if vip.Is4() {
		mac, err = l.arpProbe(ifi, vip, deadline)
	} else {
		mac, err = l.ndpProbe(ifi, vip, deadline)
	}
	if err != nil {
		return err
	}
	if mac != nil {
		l.log.Warn("VIP conflict: another host answered the probe; not binding", "vip", vip, "mac", mac.String(), "interface", ifi.Name)
		return &ConflictError{VIP: vip, MAC: mac}
	}
	return nil
}

// arpProbe sends an RFC 5227 probe (sender IP 0.0.0.0) and returns the MAC
// of whoever claims vip before the deadline.
func (l *L2) arpProbe(ifi *net.Interface, vip netip.Addr, deadline time.Time) (net.HardwareAddr, error) {
	c, err := arp.Dial(ifi)
	if err != nil {
		return nil, fmt.Errorf("ARP probe on %s: %w", ifi.Name, err)
	}
	defer c.Close()
	p, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, netip.IPv4Unspecified(), make(net.HardwareAddr, 6), vip)
	if err != nil {
		return nil, err
	}
	if err := c.WriteTo(p, ethernet.Broadcast); err != nil {
		return nil, fmt.Errorf("ARP probe for %s: %w", vip, err)
	}
	if err := c.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	for {
		r, _, err := c.Read()
		if err != nil {
			if isTimeout(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("ARP probe for %s: %w", vip, err)
		}
		if r.SenderIP == vip && r.SenderHardwareAddr.String() != ifi.HardwareAddr.String() {
			return r.SenderHardwareAddr, nil
		}
	}
}

// ndpProbe sends a duplicate-address-detection neighbour solicitation
// (source ::) and returns the MAC of whoever advertises vip.
func (l *L2) ndpProbe(ifi *net.Interface, vip netip.Addr, deadline time.Time) (net.HardwareAddr, error) {
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return nil, fmt.Errorf("neighbour probe on %s: %w", ifi.Name, err)
	}
	defer c.Close()
	snm, err := ndp.SolicitedNodeMulticast(vip)
	if err != nil {
		return nil, err
	}
	// Ask like a host doing DAD would, but from our link-local address so
	// the holder answers by unicast-or-multicast NA that we can read; a
	// holder answers either way.
	ns := &ndp.NeighborSolicitation{
		TargetAddress: vip,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}},
	}
	if err := c.WriteTo(ns, nil, snm); err != nil {
		return nil, fmt.Errorf("neighbour probe for %s: %w", vip, err)
	}
	if err := c.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	for {
		m, _, _, err := c.ReadFrom()
		if err != nil {
			if isTimeout(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("neighbour probe for %s: %w", vip, err)
		}
		na, ok := m.(*ndp.NeighborAdvertisement)
		if !ok || na.TargetAddress != vip {
			continue
		}
		for _, o := range na.Options {
			if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target && lla.Addr.String() != ifi.HardwareAddr.String() {
				return lla.Addr, nil
			}
		}
		// An NA without a target link-layer option still proves a holder.
		return net.HardwareAddr{}, nil
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Close releases nothing: sockets are opened per operation.
func (l *L2) Close() error { return nil }
