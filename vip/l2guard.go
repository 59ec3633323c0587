package vip

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/rawconn"
	"github.com/vipd/vipd/vip/conflict"
)

// The conflict guard (vip/conflict) of the l2 announcer: every address this
// node binds is watched on the wire, and an ARP packet or a neighbour
// advertisement claiming it from a MAC that is not this host's is a
// conflict (RFC 5227 section 2.4): counted, logged once with the MAC,
// shown in /status, and defended by announcing the address again at once
// and then at most once a second while the claims go on. The l2 announcer
// carries the guard's decisions out; the guard itself is pure.
//
// Two packet sockets read the interface while the watch runs: one for ARP
// (every ARP frame on the segment, parsed in user space: ARP is a few
// frames a second on a busy segment) and one for IPv6 that a BPF filter
// limits to neighbour advertisements (naFilter).

// guardReopen is how long the guard waits before opening its sockets again
// after they failed (the interface went away).
const guardReopen = time.Second

// guardStep feeds the guard one event and carries its output out.
// Defences are sent from the caller's goroutine.
func (l *L2) guardStep(ctx context.Context, ev conflict.Event) {
	l.gmu.Lock()
	out := l.guard.Step(ev, time.Now())
	l.guardNext = out.Next
	l.gmu.Unlock()
	select {
	case l.guardKick <- struct{}{}:
	default: // a wake-up is pending: it reads guardNext then
	}
	for _, r := range out.Reports {
		v := hostPrefix(r.Addr).String()
		if r.Ended {
			l.log.Info("VIP conflict over: the foreign host has not claimed the address for a while",
				"vip", r.Addr, "mac", r.MAC, "claims", r.Claims, "defended", r.Defended, "first", r.First, "last", r.Last)
			continue
		}
		l.addrConflicts.WithLabelValues(v).Inc()
		l.log.Warn("VIP conflict: another host claims an address this node holds; defending it",
			"vip", r.Addr, "mac", r.MAC, "interface", l.ifname)
	}
	for _, a := range out.Defend {
		if err := l.Announce(ctx, hostPrefix(a)); err != nil {
			l.log.Warn("VIP conflict: cannot defend the address", "vip", a, "err", err)
		}
	}
}

// Conflicts lists the addresses with a conflict now or recently, for
// /status.
func (l *L2) Conflicts() []conflict.Status {
	l.gmu.Lock()
	defer l.gmu.Unlock()
	if st := l.guard.Status(); st != nil {
		return st
	}
	return []conflict.Status{}
}

// guarded reports whether this node binds addr.
func (l *L2) guarded(addr netip.Addr) bool {
	l.gmu.Lock()
	defer l.gmu.Unlock()
	return l.guard.Bound(addr)
}

// runGuard reads claims off the wire and wakes the guard at its deadlines
// until ctx is done; every goroutine it starts has returned when it does.
func (l *L2) runGuard(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		l.readClaims(ctx, "arp", unix.ETH_P_ARP, &packet.Config{Filter: arpGuardFilter}, l.arpFrame)
	}()
	go func() {
		defer wg.Done()
		l.readClaims(ctx, "neighbour advertisements", unix.ETH_P_IPV6, &packet.Config{Filter: naGuardFilter}, l.naFrame)
	}()
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.guardKick:
			l.gmu.Lock()
			next := l.guardNext
			l.gmu.Unlock()
			arm(timer, next)
		case <-timer.C:
			l.guardStep(ctx, conflict.Tick{})
		}
	}
}

// arpGuardFilter passes the ARP frames that can claim an address: not
// sent by this host (outgoing), with a sender address (not a probe's
// 0.0.0.0). Every other frame would wake the reader for nothing.
var arpGuardFilter = mustAssemble([]bpf.Instruction{
	bpf.LoadExtension{Num: bpf.ExtType},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.PACKET_OUTGOING, SkipTrue: 5},
	bpf.LoadAbsolute{Off: 12, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.ETH_P_ARP, SkipTrue: 3},
	bpf.LoadAbsolute{Off: 14 + 14, Size: 4}, // the sender IP
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipTrue: 1},
	bpf.RetConstant{Val: 1 << 16},
	bpf.RetConstant{Val: 0},
})

// naGuardFilter is naFilter for frames this host did not send.
var naGuardFilter = mustAssemble([]bpf.Instruction{
	bpf.LoadExtension{Num: bpf.ExtType},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.PACKET_OUTGOING, SkipTrue: 7},
	bpf.LoadAbsolute{Off: 12, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.ETH_P_IPV6, SkipTrue: 5},
	bpf.LoadAbsolute{Off: 14 + 6, Size: 1},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_ICMPV6, SkipTrue: 3},
	bpf.LoadAbsolute{Off: 14 + 40, Size: 1},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(ipv6.ICMPTypeNeighborAdvertisement), SkipTrue: 1},
	bpf.RetConstant{Val: 1 << 16},
	bpf.RetConstant{Val: 0},
})

// arm sets timer to fire at next (zero: not at all).
func arm(timer *time.Timer, next time.Time) {
	if !timer.Stop() {
		select {
		case <-timer.C:
		default:
		}
	}
	if next.IsZero() {
		return
	}
	timer.Reset(max(time.Until(next), 0))
}

// readClaims reads frames of one EtherType on the VIP interface and hands
// each to frame, opening the socket again when the interface is replaced
// or the socket fails, until ctx is done.
func (l *L2) readClaims(ctx context.Context, what string, proto int, cfg *packet.Config, frame func(context.Context, []byte, net.HardwareAddr)) {
	failing := false
	for ctx.Err() == nil {
		err := l.readClaimsOnce(ctx, proto, cfg, frame, func() {
			if failing {
				l.log.Info("conflict guard: reading the VIP interface again", "interface", l.ifname, "socket", what)
				failing = false
			}
		})
		if ctx.Err() != nil {
			return
		}
		if !failing {
			l.log.Warn("conflict guard: cannot read the VIP interface; trying again every second", "interface", l.ifname, "socket", what, "err", err)
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(guardReopen):
		}
	}
}

func (l *L2) readClaimsOnce(ctx context.Context, proto int, cfg *packet.Config, frame func(context.Context, []byte, net.HardwareAddr), opened func()) error {
	ifi, err := net.InterfaceByIndex(int(l.index.Load()))
	if err != nil {
		return err
	}
	c, err := packet.Listen(ifi, packet.Raw, proto, cfg)
	if err != nil {
		return err
	}
	// Frames are read, and the verification's probes sent, with raw
	// system calls: a regular call wakes the runtime's monitor thread,
	// which then polls until the process is idle again, and every node
	// reads the others' probes and the holder's answers each second.
	raw, err := rawconn.WrapPacket(c)
	if err != nil {
		_ = c.Close()
		return err
	}
	opened()
	if proto == unix.ETH_P_ARP {
		// The verification rounds send their ARP probes on it.
		l.setWire(&wireConn{c: c, raw: raw, ifi: ifi})
		defer l.setWire(nil)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer func() {
		if stop() {
			_ = c.Close()
		}
	}()
	buf := make([]byte, ifi.MTU+14)
	for {
		// A deadline now and then to notice the interface replaced
		// under its name (a new index): read the new one.
		if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			return err
		}
		n, err := raw.Recv(buf)
		if err != nil {
			if isTimeout(err) {
				if int(l.index.Load()) != ifi.Index {
					return errors.New("interface replaced")
				}
				continue
			}
			return err
		}
		frame(ctx, buf[:n], ifi.HardwareAddr)
	}
}

// wireConn is the guard's ARP socket, shared with the verification
// rounds for sending their probes (packet sockets are safe for concurrent
// writes), with the interface it was opened on.
type wireConn struct {
	c   *packet.Conn
	raw *rawconn.Packet // c, read and written with raw calls
	ifi *net.Interface
}

func (l *L2) setWire(w *wireConn) {
	l.gmu.Lock()
	l.wire = w
	l.gmu.Unlock()
}

func (l *L2) wireConn() *wireConn {
	l.gmu.Lock()
	defer l.gmu.Unlock()
	return l.wire
}

// arpFrame hands an ARP frame that claims an address, from a MAC that is
// not this interface's, to foreignClaim.
func (l *L2) arpFrame(ctx context.Context, b []byte, own net.HardwareAddr) {
	// Most ARP frames name an address nobody here cares about (or
	// 0.0.0.0: a probe): look at the sender address in place first,
	// before parsing (which allocates).
	const sender = 14 + 14 // Ethernet header, then ARP up to the sender IP
	if len(b) < sender+4 || b[12] != 0x08 || b[13] != 0x06 {
		return
	}
	if sip := netip.AddrFrom4([4]byte(b[sender : sender+4])); sip.IsUnspecified() || !l.guarded(sip) && !l.awaited(sip) {
		return
	}
	var f ethernet.Frame
	if err := f.UnmarshalBinary(b); err != nil || f.EtherType != ethernet.EtherTypeARP {
		return
	}
	var p arp.Packet
	if err := p.UnmarshalBinary(f.Payload); err != nil {
		return
	}
	if !p.SenderIP.IsValid() || p.SenderIP.IsUnspecified() {
		return
	}
	if mac := arpClaim(&p, &f, p.SenderIP, own); mac != nil {
		l.foreignClaim(ctx, p.SenderIP, mac)
	}
}

// naFrame does the same for a neighbour advertisement.
func (l *L2) naFrame(ctx context.Context, b []byte, own net.HardwareAddr) {
	target, mac := naParse(b, own)
	if mac == nil {
		return
	}
	l.foreignClaim(ctx, target, mac)
}

// foreignClaim: another host's MAC claimed addr. For an address this node
// binds it is a conflict (the guard); for one the verification round is
// waiting for, the holder answered. Anything else is ignored, before the
// (cached) look-up of this host's MACs.
func (l *L2) foreignClaim(ctx context.Context, addr netip.Addr, mac net.HardwareAddr) {
	guarded, awaited := l.guarded(addr), l.awaited(addr)
	if !guarded && !awaited {
		return
	}
	if own, err := l.ownMAC(mac, addr); own || err != nil {
		if err != nil {
			l.log.Warn("conflict guard: cannot tell whether a MAC is this host's", "vip", addr, "mac", mac.String(), "err", err)
		}
		return
	}
	if awaited {
		l.answered(addr, mac)
	}
	if guarded {
		l.guardStep(ctx, conflict.Claim{Addr: addr, MAC: mac})
	}
}
