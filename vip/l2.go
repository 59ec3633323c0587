package vip

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/vip/conflict"
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
//
// The VIP's address is vipd's whatever form it is bound in: Present counts
// an entry with any prefix length or label, Release removes every one and
// verifies it, Acquire replaces a foreign one by its own. A VIP is bound
// only on an interface that is up (ErrLinkDown otherwise).
type L2 struct {
	ifname       string
	label        string
	probeTimeout time.Duration
	log          *slog.Logger
	announced    *prometheus.CounterVec
	conflicts    *prometheus.CounterVec
	// index is the interface's index when last found by name, to find its
	// addresses after a rename.
	index atomic.Int32
	// macs is every MAC of this host: answers from them are never another
	// holder's.
	macs *hostMACs
	// watchRcvBuf is the receive buffer of the watch's netlink sockets;
	// zero: the system default (tests make it tiny to overflow it).
	watchRcvBuf int

	// The conflict guard (l2guard.go): the addresses bound, the foreign
	// claims seen; guardKick wakes its timer loop for guardNext.
	gmu           sync.Mutex
	guard         *conflict.Guard
	guardNext     time.Time
	guardKick     chan struct{}
	addrConflicts *prometheus.CounterVec
	wire          *wireConn // the guard's ARP socket while it is open

	// The verification by the other nodes (l2verify.go), nil when off;
	// poke asks the watch to have the held VIPs checked at once.
	vmu    sync.Mutex
	verify *verification
	poke   chan struct{}
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
	ifi, err := net.InterfaceByName(opts.Interface)
	if err != nil {
		return nil, fmt.Errorf("VIPD_INTERFACE %q: %w", opts.Interface, err)
	}
	label := opts.Interface + ":vipd"
	if len(label) > 15 {
		label = opts.Interface
	}
	l := &L2{
		ifname: opts.Interface, label: label, probeTimeout: opts.ProbeTimeout, log: log, macs: newHostMACs(),
		announced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_announcements_total", Help: "Gratuitous ARP and unsolicited neighbour advertisements sent, by VIP and kind.",
		}, []string{"vip", "kind"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_conflicts_total", Help: "Times another host answered the conflict probe for a VIP, before binding it or while holding it.",
		}, []string{"vip"}),
		addrConflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_address_conflicts_total", Help: "Conflicts seen on the wire: another host's MAC (not this host's) claimed, by ARP or neighbour advertisement, an address this node holds; one per foreign MAC and episode (it ends after 10 s without a claim).",
		}, []string{"vip"}),
		guard:     conflict.New(0, 0),
		guardKick: make(chan struct{}, 1),
		poke:      make(chan struct{}, 1),
	}
	l.index.Store(int32(ifi.Index))
	if reg != nil {
		if err := reg.Register(l.announced); err != nil {
			return nil, err
		}
		if err := reg.Register(l.conflicts); err != nil {
			return nil, err
		}
		if err := reg.Register(l.addrConflicts); err != nil {
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

// ErrLinkDown means the VIP interface cannot carry the VIP: it is
// administratively down, has no carrier (operationally down), or no longer
// exists under its configured name.
var ErrLinkDown = errors.New("VIP interface is down or missing")

// linkDownReason says why a link cannot carry a VIP, or "" when it can. A
// link must be administratively up and operationally up; drivers that do
// not report an operational state (unknown: dummy, some tunnels) must at
// least have a carrier.
func linkDownReason(a *netlink.LinkAttrs) string {
	if a.Flags&net.FlagUp == 0 {
		return "administratively down"
	}
	switch a.OperState {
	case netlink.OperUp:
		return ""
	case netlink.OperUnknown:
		if a.RawFlags&unix.IFF_LOWER_UP == 0 {
			return "without carrier"
		}
		return ""
	default:
		return "operationally " + a.OperState.String()
	}
}

// lookup finds the VIP interface by name. When the name is gone but the
// interface seen last still exists under another name (renamed), it returns
// that one together with an error wrapping ErrLinkDown: addresses stay on an
// interface when it is renamed, so Present and Release must still find them
// there.
func (l *L2) lookup() (netlink.Link, error) {
	link, err := netlink.LinkByName(l.ifname)
	if err == nil {
		l.index.Store(int32(link.Attrs().Index))
		return link, nil
	}
	var nf netlink.LinkNotFoundError
	if !errors.As(err, &nf) {
		return nil, fmt.Errorf("interface %s: %w", l.ifname, err)
	}
	if idx := l.index.Load(); idx > 0 {
		if old, ierr := netlink.LinkByIndex(int(idx)); ierr == nil {
			return old, fmt.Errorf("interface %s does not exist any more (renamed to %s?): %w", l.ifname, old.Attrs().Name, ErrLinkDown)
		}
	}
	return nil, fmt.Errorf("interface %s does not exist (renamed or removed?): %w", l.ifname, ErrLinkDown)
}

// upLink returns the VIP interface if it can carry a VIP now, or an error
// wrapping ErrLinkDown when it is down or gone (with the link, when there
// is one: down, or renamed, so that the caller can unbind from it).
func (l *L2) upLink() (netlink.Link, *net.Interface, error) {
	link, err := l.lookup()
	if err != nil {
		return link, nil, err
	}
	if why := linkDownReason(link.Attrs()); why != "" {
		return link, nil, fmt.Errorf("interface %s is %s: %w", l.ifname, why, ErrLinkDown)
	}
	return link, netInterface(link.Attrs()), nil
}

// netInterface is the net.Interface of a link netlink just described:
// net.InterfaceByName would dump every link of the host again (1 to 3 ms
// of CPU on a small VM, at every announcement and check).
func netInterface(a *netlink.LinkAttrs) *net.Interface {
	return &net.Interface{Index: a.Index, MTU: a.MTU, Name: a.Name, HardwareAddr: a.HardwareAddr, Flags: a.Flags}
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

func family(vip netip.Prefix) int {
	if vip.Addr().Is6() {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

// entries returns every address on link equal to the VIP's address,
// whatever its prefix length or label (vipd's own, one left by an operator,
// by kube-vip or by a crashed vipd), and all addresses of the family.
func (l *L2) entries(link netlink.Link, vip netip.Prefix) (match, all []netlink.Addr, err error) {
	all, err = netlink.AddrList(link, family(vip))
	if err != nil {
		return nil, nil, fmt.Errorf("list addresses on %s: %w", link.Attrs().Name, err)
	}
	for _, a := range all {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == vip.Addr() {
			match = append(match, a)
		}
	}
	return match, all, nil
}

// ours reports whether a is exactly the entry Acquire binds for vip.
func (l *L2) ours(a netlink.Addr, vip netip.Prefix) bool {
	ones, _ := a.Mask.Size()
	if ones != vip.Bits() {
		return false
	}
	return vip.Addr().Is6() || a.Label == l.label
}

// Acquire probes for the VIP (unless it is already bound) and binds it. It
// fails with an error wrapping ErrLinkDown, and leaves the VIP unbound, when
// the interface is down or gone. A VIP already bound in another form (other
// prefix length or label) is adopted: it is replaced by vipd's own entry.
func (l *L2) Acquire(ctx context.Context, vip netip.Prefix) error {
	return l.acquire(ctx, vip, true)
}

// AcquireHandover binds the VIP without the conflict probe: the previous
// holder has just released it for this node (vip.HandoverAcquirer).
func (l *L2) AcquireHandover(ctx context.Context, vip netip.Prefix) error {
	return l.acquire(ctx, vip, false)
}

func (l *L2) acquire(ctx context.Context, vip netip.Prefix, probe bool) error {
	link, ifi, err := l.upLink()
	if err != nil {
		if link != nil && errors.Is(err, ErrLinkDown) {
			l.unbindAfter(link, vip, err)
		}
		return err
	}
	match, _, err := l.entries(link, vip)
	if err != nil {
		return err
	}
	if !usable(match) && l.probeTimeout > 0 && probe {
		if err := l.probe(ctx, ifi, vip.Addr()); err != nil {
			var ce *ConflictError
			if errors.As(err, &ce) {
				l.conflicts.WithLabelValues(vip.String()).Inc()
				l.log.Warn("VIP conflict: another host answered the probe; not binding", "vip", vip.Addr(), "mac", ce.MAC.String(), "interface", ifi.Name)
			}
			return err
		}
	}
	// Entries in another form are removed first: the kernel keys IPv6
	// addresses (and IPv4 ones of the same prefix length) by address alone,
	// so a replace would keep the foreign prefix length or label.
	var foreign []netlink.Addr
	for _, a := range match {
		if !l.ours(a, vip) {
			foreign = append(foreign, a)
		}
	}
	if len(foreign) > 0 {
		l.log.Info("adopting a VIP bound in another form", "vip", vip, "interface", l.ifname, "found", describe(foreign))
		if err := l.remove(link, vip, foreign); err != nil {
			return err
		}
	}
	if err := netlink.AddrReplace(link, l.addr(vip)); err != nil {
		return fmt.Errorf("bind %s on %s: %w", vip, l.ifname, err)
	}
	// The link may have gone down while probing or binding: never leave a
	// VIP bound on a link that cannot carry it (it would answer the moment
	// the link comes back, maybe next to another holder).
	if _, _, err := l.upLink(); err != nil {
		l.unbindAfter(link, vip, err)
		return err
	}
	// A VIP's conflict count is exported from its first acquire on (pool
	// addresses only once they have one: there may be thousands).
	l.addrConflicts.WithLabelValues(hostPrefix(vip.Addr()).String()).Add(0)
	l.guardStep(ctx, conflict.Bound{Addr: vip.Addr()})
	return nil
}

// unbindAfter removes the VIP after a failed acquire, logging a failure to
// do so (the caller reports the acquire's own error).
func (l *L2) unbindAfter(link netlink.Link, vip netip.Prefix, cause error) {
	match, _, err := l.entries(link, vip)
	if err == nil && len(match) > 0 {
		err = l.remove(link, vip, match)
	}
	if err != nil {
		l.log.Error("cannot unbind the VIP after a failed acquire", "vip", vip, "interface", l.ifname, "cause", cause, "err", err)
	}
}

// Release removes every address equal to the VIP from the interface,
// whatever its prefix length or label, and checks that none is left.
func (l *L2) Release(ctx context.Context, vip netip.Prefix) error {
	// Not defended any more from now on, whatever happens below.
	l.guardStep(ctx, conflict.Unbound{Addr: vip.Addr()})
	l.forgetUnverified(vip.Addr())
	link, err := l.lookup()
	if link == nil {
		if errors.Is(err, ErrLinkDown) {
			return nil // the interface is gone, and its addresses with it
		}
		return err
	}
	match, _, err := l.entries(link, vip)
	if err != nil {
		return err
	}
	return l.remove(link, vip, match)
}

// remove deletes the given entries of the VIP and verifies they are gone.
// Deleting a primary IPv4 address deletes its secondaries too unless
// promote_secondaries is set (a leftover VIP/24 bound before the node's own
// address in that subnet): such collateral losses are put back.
func (l *L2) remove(link netlink.Link, vip netip.Prefix, entries []netlink.Addr) error {
	name := link.Attrs().Name
	_, before, err := l.entries(link, vip)
	if err != nil {
		return err
	}
	for i := range entries {
		if err := netlink.AddrDel(link, &entries[i]); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("remove %s from %s: %w", entries[i].IPNet, name, err)
		}
	}
	left, after, err := l.entries(link, vip)
	if err != nil {
		return err
	}
	l.restore(link, vip, before, after)
	for _, a := range left {
		for _, e := range entries {
			if a.Equal(e) {
				return fmt.Errorf("remove %s from %s: still bound after deleting it", a.IPNet, name)
			}
		}
	}
	return nil
}

// restore re-adds addresses other than the VIP that vanished while the VIP
// was removed.
func (l *L2) restore(link netlink.Link, vip netip.Prefix, before, after []netlink.Addr) {
	for _, b := range before {
		if ip, ok := netip.AddrFromSlice(b.IP); ok && ip.Unmap() == vip.Addr() {
			continue
		}
		gone := true
		for _, a := range after {
			if a.Equal(b) {
				gone = false
				break
			}
		}
		if !gone {
			continue
		}
		r := b
		r.Flags &^= unix.IFA_F_SECONDARY
		err := netlink.AddrAdd(link, &r)
		l.log.Warn("the kernel removed an address together with the VIP (a primary VIP entry with secondaries, promote_secondaries off); re-added it",
			"vip", vip, "interface", link.Attrs().Name, "address", b.IPNet.String(), "err", err)
	}
}

// describe lists addresses as ip prints them, for logs.
func describe(as []netlink.Addr) string {
	var out []string
	for _, a := range as {
		s := a.IPNet.String()
		if a.Label != "" {
			s += " label " + a.Label
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

// Present reports whether the VIP is bound and usable (not tentative or
// dadfailed) on the interface, in any form: vipd's own entry or one with
// another label or prefix length. On a renamed interface it still reports
// the addresses there, so that they are released.
func (l *L2) Present(_ context.Context, vip netip.Prefix) (bool, error) {
	link, err := l.lookup()
	if link == nil {
		if errors.Is(err, ErrLinkDown) {
			return false, nil
		}
		return false, err
	}
	match, _, err := l.entries(link, vip)
	if err != nil {
		return false, err
	}
	return usable(match), nil
}

// usable reports whether any entry answers for the address.
func usable(match []netlink.Addr) bool {
	for _, a := range match {
		if a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
			return true
		}
	}
	return false
}

// Check reports whether a VIP this node holds still works: nil while it
// does, an error wrapping ErrLinkDown when the interface is down or gone,
// one wrapping ErrUnverified when most other nodes report they cannot reach
// the VIP through this node (l2verify.go), and with probe a *ConflictError
// when another MAC answers for the VIP.
//
// The probe works while we hold the VIP ourselves: an RFC 5227 ARP probe
// (sender IP 0.0.0.0) or a neighbour solicitation sent from a socket is
// never answered by our own kernel on the wire, and answers carrying our own
// MAC are ignored. A probe waits ProbeTimeout when nobody else answers (the
// usual case); with a zero ProbeTimeout no probe is sent.
func (l *L2) Check(ctx context.Context, vip netip.Prefix, probe bool) error {
	_, ifi, err := l.upLink()
	if err != nil {
		return err
	}
	if why := l.unverified(vip.Addr()); why != "" {
		return fmt.Errorf("%s: %w", why, ErrUnverified)
	}
	if !probe || l.probeTimeout <= 0 {
		return nil
	}
	if err := l.probe(ctx, ifi, vip.Addr()); err != nil {
		var ce *ConflictError
		if errors.As(err, &ce) {
			l.conflicts.WithLabelValues(vip.String()).Inc()
			l.log.Warn("VIP conflict: another host answers for a VIP this node holds", "vip", vip.Addr(), "mac", ce.MAC.String(), "interface", ifi.Name)
		}
		return err
	}
	return nil
}

// Announce sends gratuitous ARP (Request and Reply) for an IPv4 VIP or an
// unsolicited neighbour advertisement with the Override flag for IPv6.
func (l *L2) Announce(_ context.Context, vip netip.Prefix) error {
	_, ifi, err := l.upLink()
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
	c, _, err := ndp.Listen(ndpInterface(ifi), ndp.LinkLocal)
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

// probe asks whether anybody else answers for vip: a *ConflictError naming
// the first other MAC that does, nil when nobody does before the timeout.
// Answers from our own MAC never count.
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
	if len(mac) == 0 {
		return nil
	}
	return &ConflictError{VIP: vip, MAC: mac}
}

// arpProbe sends an RFC 5227 probe (sender IP 0.0.0.0) and returns the MAC
// of whoever else claims vip before the deadline. Our own kernel never sees
// the frame we send, so it does not answer even while we hold the VIP; an
// ARP packet carrying our own MAC is ignored all the same.
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
		r, eth, err := c.Read()
		if err != nil {
			if isTimeout(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("ARP probe for %s: %w", vip, err)
		}
		if mac := arpClaim(r, eth, vip, ifi.HardwareAddr); mac != nil {
			if own, err := l.ownMAC(mac, vip); own || err != nil {
				if err != nil {
					return nil, fmt.Errorf("ARP probe for %s: %w", vip, err)
				}
				continue
			}
			return mac, nil
		}
	}
}

// ownMAC reports whether mac, which claimed vip, is one of this host's
// own interfaces (a second NIC on the segment answering for a local
// address): never another holder.
func (l *L2) ownMAC(mac net.HardwareAddr, vip netip.Addr) (bool, error) {
	own, err := l.macs.own(mac, time.Now())
	if own {
		l.log.Debug("an answer for the VIP came from another interface of this host; not a conflict (see arp_ignore in docs/l2.md)", "vip", vip, "mac", mac.String())
	}
	return own, err
}

// arpClaim returns the MAC of another host claiming vip in an ARP packet
// (a reply to our probe, or its own announcement), nil if the packet is no
// such claim or comes from us.
func arpClaim(p *arp.Packet, eth *ethernet.Frame, vip netip.Addr, own net.HardwareAddr) net.HardwareAddr {
	if p == nil || p.SenderIP != vip || len(p.SenderHardwareAddr) == 0 {
		return nil
	}
	if bytes.Equal(p.SenderHardwareAddr, own) || eth != nil && bytes.Equal(eth.Source, own) {
		return nil
	}
	return p.SenderHardwareAddr
}

// ndpProbe sends a neighbour solicitation for vip to its solicited-node
// multicast group and returns the MAC of whoever else advertises it. Answers
// are read as raw frames, so the sender's MAC is known even when the
// advertisement carries no target link-layer option; our own frames and
// advertisements naming our own MAC are ignored.
func (l *L2) ndpProbe(ifi *net.Interface, vip netip.Addr, deadline time.Time) (net.HardwareAddr, error) {
	rc, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_IPV6, &packet.Config{Filter: naFilter})
	if err != nil {
		return nil, fmt.Errorf("neighbour probe on %s: %w", ifi.Name, err)
	}
	defer rc.Close()
	// From our link-local address, so a holder answers (by unicast) as it
	// would any host resolving the VIP; :: (bound to the interface) when
	// there is no link-local address.
	c, _, err := ndp.Listen(ndpInterface(ifi), ndp.LinkLocal)
	if err != nil {
		c, _, err = ndp.Listen(ndpInterface(ifi), ndp.Unspecified)
	}
	if err != nil {
		return nil, fmt.Errorf("neighbour probe on %s: %w", ifi.Name, err)
	}
	defer c.Close()
	snm, err := ndp.SolicitedNodeMulticast(vip)
	if err != nil {
		return nil, err
	}
	ns := &ndp.NeighborSolicitation{
		TargetAddress: vip,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}},
	}
	if err := c.WriteTo(ns, nil, snm); err != nil {
		return nil, fmt.Errorf("neighbour probe for %s: %w", vip, err)
	}
	if err := rc.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	buf := make([]byte, 1500)
	for {
		n, _, err := rc.ReadFrom(buf)
		if err != nil {
			if isTimeout(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("neighbour probe for %s: %w", vip, err)
		}
		if mac := naClaim(buf[:n], vip, ifi.HardwareAddr); mac != nil {
			if own, err := l.ownMAC(mac, vip); own || err != nil {
				if err != nil {
					return nil, fmt.Errorf("neighbour probe for %s: %w", vip, err)
				}
				continue
			}
			return mac, nil
		}
	}
}

// naFilter passes only Ethernet frames carrying IPv6 ICMPv6 neighbour
// advertisements without extension headers (what hosts send).
var naFilter = mustAssemble([]bpf.Instruction{
	bpf.LoadAbsolute{Off: 12, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.ETH_P_IPV6, SkipTrue: 5},
	bpf.LoadAbsolute{Off: 14 + 6, Size: 1},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_ICMPV6, SkipTrue: 3},
	bpf.LoadAbsolute{Off: 14 + 40, Size: 1},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(ipv6.ICMPTypeNeighborAdvertisement), SkipTrue: 1},
	bpf.RetConstant{Val: 1 << 16},
	bpf.RetConstant{Val: 0},
})

func mustAssemble(p []bpf.Instruction) []bpf.RawInstruction {
	raw, err := bpf.Assemble(p)
	if err != nil {
		panic(err)
	}
	return raw
}

// naClaim returns the MAC of another host advertising vip in an Ethernet
// frame, or nil: not a neighbour advertisement for vip, or sent by us (the
// frame's source or the advertised link-layer address is our own MAC). The
// MAC returned is the advertised target link-layer address, or the frame's
// source when the advertisement carries none; never empty.
func naClaim(frame []byte, vip netip.Addr, own net.HardwareAddr) net.HardwareAddr {
	target, mac := naParse(frame, own)
	if target != vip {
		return nil
	}
	return mac
}

// naParse returns the target of a neighbour advertisement in an Ethernet
// frame and the MAC that claims it (as naClaim), or a nil MAC.
func naParse(frame []byte, own net.HardwareAddr) (netip.Addr, net.HardwareAddr) {
	const eth, ip6 = 14, 40
	if len(frame) < eth+ip6+4 || binary.BigEndian.Uint16(frame[12:14]) != unix.ETH_P_IPV6 || frame[eth+6] != unix.IPPROTO_ICMPV6 {
		return netip.Addr{}, nil
	}
	src := net.HardwareAddr(frame[6:12])
	if bytes.Equal(src, own) {
		return netip.Addr{}, nil
	}
	m, err := ndp.ParseMessage(frame[eth+ip6:])
	if err != nil {
		return netip.Addr{}, nil
	}
	na, ok := m.(*ndp.NeighborAdvertisement)
	if !ok {
		return netip.Addr{}, nil
	}
	mac := slices.Clone(src)
	for _, o := range na.Options {
		if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target && len(lla.Addr) > 0 {
			mac = lla.Addr
		}
	}
	if bytes.Equal(mac, own) || isZeroMAC(mac) {
		return netip.Addr{}, nil
	}
	return na.TargetAddress, mac
}

func isZeroMAC(m net.HardwareAddr) bool {
	for _, b := range m {
		if b != 0 {
			return false
		}
	}
	return true
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Close releases nothing: sockets are opened per operation.
func (l *L2) Close() error { return nil }

var _ Checker = (*L2)(nil)

// ndpInterface is ifi as mdlayher/ndp should see it. ndp addresses its
// packets by the interface's name, as the zone of an IPv6 address, and Go
// resolves zone names through a cache refreshed at most once a minute: an
// interface deleted and created again under the same name was addressed
// by its old index for up to a minute (neighbour probe: sendmsg: invalid
// argument), so an IPv6 VIP could not be bound on it. A numeric zone is
// the interface index itself (Go lists the interfaces again to look for
// such a name first: one netlink dump per NDP packet, which for a few VIPs
// is nothing).
func ndpInterface(ifi *net.Interface) *net.Interface {
	c := *ifi
	c.Name = strconv.Itoa(ifi.Index)
	return &c
}
