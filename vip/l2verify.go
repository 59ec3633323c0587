package vip

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/clock"
	"github.com/vipd/vipd/internal/gridclock"
	"github.com/vipd/vipd/vip/conflict"
)

// Verification of the holder's announcements by the other nodes (issue
// 27): the decisions are vip/conflict's Verifier; this file resolves the
// addresses, publishes and reads the verdicts through the cluster, and
// makes a holder whose announcements the others cannot receive give its
// VIP up, through Check (ErrUnverified) and the core's usual failure path:
// a Failed transition, which the daemon reports to the election
// (SetFailed), which then elects another node.

// ErrUnverified means most of the other nodes cannot reach a VIP this node
// holds: its ARP / neighbour answers do not arrive (a port filter, a broken
// switch port, an L2 security feature), although gossip does.
var ErrUnverified = errors.New("the other nodes cannot reach the VIP through this node")

// VerifyPeers is what the verification needs from the cluster.
type VerifyPeers interface {
	// SetUnverified publishes whether this node can reach vip through
	// holder, the other node it believes holds it (the lease election
	// counts a report only against the holder it names).
	SetUnverified(vip, holder string, unreachable bool)
	// UnverifiedBy returns the other alive members that report they
	// cannot reach vip, and how many other alive members there are.
	UnverifiedBy(vip string) (reporters []string, others int)
	// MemberAddr returns a member's own (gossip) address: the MACs that
	// answer for it are that node's NICs.
	MemberAddr(name string) (netip.Addr, bool)
}

// VerifyOptions turn the verification on (EnableVerify).
type VerifyOptions struct {
	// Every is the time between two rounds (zero: conflict.VerifyEvery).
	Every time.Duration
	// Wait is how long a round waits for answers (zero: 300 ms).
	Wait time.Duration
	// Port, when not zero: a round also connects to the VIP on this TCP
	// port (VIPD_VERIFY_PORT); a refused or timed-out connection is a miss.
	Port  uint16
	Peers VerifyPeers
	// ElectionMoves: the election itself moves a VIP most others cannot
	// verify (the lease election's leader reads the reports): the holder
	// does not give it up on its own (no ErrUnverified, no step-aside that
	// would move its pool addresses too); it says why when it loses it.
	ElectionMoves bool
}

const verifyWait = 300 * time.Millisecond

// verification is the state of the verification on one L2.
type verification struct {
	opts   VerifyOptions
	v      *conflict.Verifier
	next   time.Time
	queue  map[netip.Addr]conflict.Holder // holder changes not yet fed, the latest per address
	prefix map[netip.Addr]netip.Prefix
	denied map[netip.Addr]string // VIPs this node holds that the others cannot reach, with why
	kick   chan struct{}
	// round holds the addresses the current round waits for, with the
	// MACs that answered (the guard's readers see the answers); nil
	// between rounds.
	round map[netip.Addr]map[string]bool
	// wait ends a round's wait for its answers (runVerify's).
	wait clock.Timer
	// dups: addresses two or more MACs answered for in one round (two
	// holders), with when the episode began and was last seen.
	dups     map[netip.Addr]*Duplicate
	dupCount *prometheus.CounterVec
	holder   map[netip.Addr]string // who holds each VIP, by name
	self     map[netip.Addr]bool   // the VIPs this node holds, as last told
	// lost: VIPs this node held until the election moved them, not yet
	// checked for the others' reports (an election that acts on the
	// reports itself, the lease, moves a VIP before its holder gives it
	// up: the holder still says why it lost it).
	lost map[netip.Addr]bool
	// given: VIPs this node gave up itself on the reports (counted once).
	given map[netip.Addr]bool
	// reported: the others' reports on this node's addresses at the last
	// round (Peers with Reported), by prefix, and how many others verify.
	reported     map[string][]string
	reportOthers int
	// kinds: the addresses verified beside the core's VIPs (pool,
	// egress), by kind: every one of them, and the ones this node holds.
	// Their holders are not known here (UnknownHolder); their metrics are
	// per kind, not per address.
	kinds     map[string]*kindAddrs
	kindOf    map[netip.Addr]string
	drop      map[netip.Addr]bool      // addresses of a kind gone: forgotten after the verifier's last verdict
	overlap   map[netip.Addr]time.Time // agreed second holders (SetOverlap), until
	kindUnr   *prometheus.GaugeVec
	kindCount *prometheus.GaugeVec
	kindMoved *prometheus.CounterVec
	// ndp sends the rounds' neighbour solicitations (opened on first use,
	// again when the interface changes; it receives nothing).
	ndp      *ndp.Conn
	ndpIndex int
	unreach  *prometheus.GaugeVec
	unverify *prometheus.GaugeVec
	gaveUp   *prometheus.CounterVec
	rounds   prometheus.Counter
}

// EnableVerify turns the verification on; call it before Watch (the
// rounds run as long as the watch does). reg registers its metrics.
func (l *L2) EnableVerify(opts VerifyOptions, reg prometheus.Registerer) error {
	if opts.Wait <= 0 {
		opts.Wait = verifyWait
	}
	vf := &verification{
		opts: opts, v: conflict.NewVerifier(opts.Every),
		queue: map[netip.Addr]conflict.Holder{}, prefix: map[netip.Addr]netip.Prefix{}, denied: map[netip.Addr]string{},
		dups: map[netip.Addr]*Duplicate{}, holder: map[netip.Addr]string{}, self: map[netip.Addr]bool{}, lost: map[netip.Addr]bool{}, given: map[netip.Addr]bool{},
		dupCount: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_duplicate_answers_total", Help: "Verification rounds (on a node that does not hold the VIP) in which more than one host answered for the VIP: one per set of MACs and episode (it ends after 10 s without).",
		}, []string{"vip"}),
		kinds: map[string]*kindAddrs{}, kindOf: map[netip.Addr]string{}, drop: map[netip.Addr]bool{}, overlap: map[netip.Addr]time.Time{},
		kindUnr: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_addresses_unreachable", Help: "Addresses of a kind (pool, egress) held by another node that this node cannot reach through their holder (l2 verification).",
		}, []string{"kind"}),
		kindCount: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_addresses_verified", Help: "Addresses of a kind (pool, egress) held by another node that this node verifies (batched: at most 64 a round).",
		}, []string{"kind"}),
		kindMoved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_addresses_unverified_total", Help: "Addresses of a kind (pool, egress) the election moved away from this node because most of the other nodes could not reach them through it.",
		}, []string{"kind"}),
		kick: make(chan struct{}, 1),
		unreach: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_vip_unreachable", Help: "1 while this node cannot reach the VIP through the node that holds it (its ARP / neighbour probes, and the VIPD_VERIFY_PORT connection, go unanswered).",
		}, []string{"vip"}),
		unverify: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_vip_unverified", Help: "1 while most of the other nodes report that they cannot reach a VIP this node holds (it then gives the VIP up).",
		}, []string{"vip"}),
		gaveUp: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_vip_unverified_total", Help: "Times this node gave a VIP up because most of the other nodes could not reach it through this node.",
		}, []string{"vip"}),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vipd_verify_rounds_total", Help: "Verification rounds: batched ARP / neighbour probes of the VIPs other nodes hold.",
		}),
	}
	vf.kind("pool") // exported from the start, 0 without pools
	if reg != nil {
		for _, c := range []prometheus.Collector{vf.unreach, vf.unverify, vf.gaveUp, vf.rounds, vf.dupCount, vf.kindUnr, vf.kindCount, vf.kindMoved} {
			if err := reg.Register(c); err != nil {
				return err
			}
		}
	}
	l.vmu.Lock()
	l.verify = vf
	l.vmu.Unlock()
	return nil
}

// SetHolder tells the verification who holds vip: holder ("" nobody),
// self when this node does. It never blocks: the change is fed to the
// verifier by its own goroutine.
func (l *L2) SetHolder(vip netip.Prefix, holder string, self bool) {
	l.vmu.Lock()
	vf := l.verify
	if vf == nil {
		l.vmu.Unlock()
		return
	}
	if _, seen := vf.prefix[vip.Addr()]; !seen {
		// Exported from the first decision on, for the configured VIPs.
		v := vip.String()
		vf.unreach.WithLabelValues(v).Set(0)
		vf.unverify.WithLabelValues(v).Set(0)
		vf.gaveUp.WithLabelValues(v).Add(0)
		vf.dupCount.WithLabelValues(v).Add(0)
	}
	if p, seen := vf.prefix[vip.Addr()]; seen && p == vip && vf.holder[vip.Addr()] == holder && vf.self[vip.Addr()] == self {
		// The same holder again: the lease election repeats its decision
		// at every renewal (five times a second on the holder), and each
		// kick cost the verifier a wake-up and a pass over the members'
		// reports for nothing.
		l.vmu.Unlock()
		return
	}
	vf.prefix[vip.Addr()] = vip
	vf.holder[vip.Addr()] = holder
	if vf.self[vip.Addr()] && !self {
		vf.lost[vip.Addr()] = true
	}
	vf.self[vip.Addr()] = self
	vf.queue[vip.Addr()] = conflict.Holder{Addr: vip.Addr(), Name: holder, Self: self}
	l.vmu.Unlock()
	select {
	case vf.kick <- struct{}{}:
	default:
	}
}

// VerifyStatus is the verification's section of /status.
type VerifyStatus struct {
	// Addresses: what this node knows of each VIP's announcements.
	Addresses []conflict.VerifyStatus `json:"addresses"`
	// Duplicates: VIPs more than one host answered for in one round,
	// seen in the last minute.
	Duplicates []Duplicate `json:"duplicates,omitempty"`
}

// Verification reports what this node knows about the announcements of
// the VIPs, for /status (nil when the verification is off).
func (l *L2) Verification() *VerifyStatus {
	l.vmu.Lock()
	defer l.vmu.Unlock()
	if l.verify == nil {
		return nil
	}
	st := &VerifyStatus{Addresses: l.verify.v.Status()}
	for _, d := range l.verify.dups {
		if time.Since(d.Last) < time.Minute {
			st.Duplicates = append(st.Duplicates, *d)
		}
	}
	slices.SortFunc(st.Duplicates, func(a, b Duplicate) int { return a.Addr.Compare(b.Addr) })
	return st
}

// unverified returns why the others cannot reach vip through this node, or "".
func (l *L2) unverified(vip netip.Addr) string {
	l.vmu.Lock()
	defer l.vmu.Unlock()
	if l.verify == nil {
		return ""
	}
	return l.verify.denied[vip]
}

// forgetUnverified clears the verdict on vip once it is released: a later
// acquire starts afresh (the verifier reports again if need be).
func (l *L2) forgetUnverified(vip netip.Addr) {
	l.vmu.Lock()
	defer l.vmu.Unlock()
	if l.verify != nil {
		delete(l.verify.denied, vip)
	}
}

// runVerify runs the rounds until ctx is done.
func (l *L2) runVerify(ctx context.Context) {
	l.vmu.Lock()
	vf := l.verify
	l.vmu.Unlock()
	if vf == nil {
		return
	}
	// A timerfd, not a Go timer: on an idle holder this timer is most of
	// what wakes the process besides the lease, and a Go timer costs up to
	// three wake-ups (gridclock.Precise).
	timer := gridclock.Precise{}.NewTimer(0)
	defer timer.Stop()
	// The rounds wait for their answers on one of their own, for the
	// same reason: a Go timer per round was one more wake-up of the
	// monitor thread and the poller a second.
	vf.wait = gridclock.Precise{}.NewTimer(time.Hour)
	defer vf.wait.Stop()
	defer func() {
		if vf.ndp != nil {
			_ = vf.ndp.Close()
			vf.ndp = nil
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-vf.kick:
		case <-timer.C():
		}
		l.vmu.Lock()
		queued := make([]conflict.Event, 0, len(vf.queue))
		for _, h := range vf.queue {
			queued = append(queued, h)
		}
		clear(vf.queue)
		lost := slices.SortedFunc(maps.Keys(vf.lost), netip.Addr.Compare)
		clear(vf.lost)
		l.vmu.Unlock()
		for _, a := range lost {
			l.lostUnverified(vf, a)
		}
		// After the losses: they are judged on the reports of the last
		// round, which the reporters withdraw once they reach the new
		// holder.
		if r, ok := vf.opts.Peers.(interface {
			Reported() (map[string][]string, int)
		}); ok {
			reps, others := r.Reported()
			l.vmu.Lock()
			vf.reported, vf.reportOthers = reps, others
			l.vmu.Unlock()
		}
		queued = append(queued, conflict.Tick{})
		if r, ok := vf.opts.Peers.(interface{ Resync() }); ok {
			r.Resync() // a report the cluster dropped is sent again
		}
		for _, ev := range queued {
			l.verifyStep(ctx, vf, ev)
		}
		l.vmu.Lock()
		for a := range vf.drop {
			if _, requeued := vf.queue[a]; !requeued {
				delete(vf.kindOf, a)
				delete(vf.prefix, a)
				delete(vf.holder, a)
				delete(vf.self, a)
				delete(vf.lost, a)
				delete(vf.drop, a)
			}
		}
		l.vmu.Unlock()
		l.vmu.Lock()
		next := vf.next
		l.vmu.Unlock()
		if next.IsZero() {
			timer.Reset(time.Hour) // nothing due: a kick wakes the loop
		} else {
			timer.Reset(max(time.Until(next), 0))
		}
	}
}

// verifyStep feeds one event and carries the output out: rounds and report
// reads are done here, on the verification's goroutine, and fed back.
func (l *L2) verifyStep(ctx context.Context, vf *verification, ev conflict.Event) {
	l.vmu.Lock()
	out := vf.v.Step(ev, time.Now())
	vf.next = out.Next
	l.vmu.Unlock()
	for _, d := range out.Verdicts {
		l.verdict(vf, d)
	}
	if len(out.Probe) > 0 {
		vf.rounds.Inc()
		probed := out.Probe
		answered, err := l.verifyRound(ctx, vf, probed)
		if err != nil {
			// This node cannot verify anything (its interface is down):
			// that says nothing about the holder. No verdict changes.
			probed = nil
		}
		l.verifyStep(ctx, vf, conflict.Probed{Addrs: probed, Answered: answered})
	}
	for _, a := range out.ReadReports {
		reporters, others := vf.opts.Peers.UnverifiedBy(l.prefixOf(vf, a).String())
		l.verifyStep(ctx, vf, conflict.Reports{Addr: a, Reporters: reporters, Others: others})
	}
}

func (l *L2) prefixOf(vf *verification, a netip.Addr) netip.Prefix {
	l.vmu.Lock()
	defer l.vmu.Unlock()
	if p, ok := vf.prefix[a]; ok {
		return p
	}
	return hostPrefix(a)
}

// verifyRound resolves the addresses as one batched round of RFC 5227
// probes (ARP probes from 0.0.0.0 and neighbour solicitations: answered by
// the holder's kernel, never changing a neighbour's cache), sent on
// sockets that stay open; the guard's readers, which see every ARP frame
// and neighbour advertisement anyway, note the answers. With a port it then
// connects to each address that answered. It returns the addresses that
// passed, or an error when the round could not be sent (the guard's socket
// is not open: this node's interface is down or gone): then nothing is
// known about the holders.
func (l *L2) verifyRound(ctx context.Context, vf *verification, addrs []netip.Addr) (map[netip.Addr]bool, error) {
	w := l.wireConn()
	if w == nil {
		return nil, errors.New("the ARP socket of the conflict guard is not open")
	}
	l.vmu.Lock()
	vf.round = make(map[netip.Addr]map[string]bool, len(addrs))
	for _, a := range addrs {
		vf.round[a] = map[string]bool{}
	}
	l.vmu.Unlock()
	defer func() {
		l.vmu.Lock()
		vf.round = nil
		l.vmu.Unlock()
	}()
	if err := l.probeAndWait(ctx, vf, w, addrs); err != nil {
		return nil, err
	}
	ok := map[netip.Addr]bool{}
	multi := map[netip.Addr]netip.Addr{} // IPv4 VIPs more than one MAC answered, to their holder's address
	var dups []netip.Addr
	l.vmu.Lock()
	for _, a := range addrs {
		macs := vf.round[a]
		if len(macs) > 0 {
			ok[a] = true
		}
		if len(macs) < 2 {
			continue
		}
		if until, ok := vf.overlap[a]; ok {
			if time.Now().Before(until) {
				continue // an agreed second holder (make-before-break)
			}
			delete(vf.overlap, a)
		}
		if vf.holder[a] == UnknownHolder {
			// A pool or egress address: its holder is not known here,
			// so a multi-homed holder's NICs cannot be told from a
			// second holder (the holder's own guard sees a second one).
			continue
		}
		dups = append(dups, a)
		if ip, known := vf.opts.Peers.MemberAddr(vf.holder[a]); known && ip.Is4() && a.Is4() {
			multi[a] = ip
		}
	}
	var second []netip.Addr
	for _, ip := range multi {
		if _, seen := vf.round[ip]; !seen {
			vf.round[ip] = map[string]bool{}
			second = append(second, ip)
		}
	}
	l.vmu.Unlock()
	// Several MACs answered for an IPv4 VIP: with arp_ignore 0 every NIC of
	// a multi-homed holder answers for the VIP, and for the holder's own
	// address alike. A second step probes the holder's address: MACs that
	// answer both are the holder's, not a second holder. (IPv6 answers
	// only on the VIP's interface.)
	if len(second) > 0 {
		if err := l.probeAndWait(ctx, vf, w, second); err != nil {
			return nil, err
		}
	}
	for _, a := range dups {
		l.vmu.Lock()
		macs := slices.Sorted(maps.Keys(vf.round[a]))
		foreign := true
		if ip, ok := multi[a]; ok {
			foreign = false
			for _, m := range macs {
				if !vf.round[ip][m] {
					foreign = true
				}
			}
		}
		l.vmu.Unlock()
		if foreign {
			l.duplicate(vf, a, macs)
		}
	}
	if vf.opts.Port == 0 {
		return ok, nil
	}
	for a := range ok {
		d := net.Dialer{Timeout: vf.opts.Wait}
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(a.String(), strconv.Itoa(int(vf.opts.Port))))
		if err != nil {
			l.log.Debug("verification: cannot connect through the VIP", "vip", a, "port", vf.opts.Port, "err", err)
			delete(ok, a)
			continue
		}
		_ = c.Close()
	}
	return ok, nil
}

// probeAndWait sends a probe for each address and waits for the answers.
func (l *L2) probeAndWait(ctx context.Context, vf *verification, w *wireConn, addrs []netip.Addr) error {
	for _, a := range addrs {
		if err := l.sendProbe(vf, w, a); err != nil {
			l.log.Debug("verification round failed", "interface", l.ifname, "err", err)
			return err
		}
	}
	vf.wait.Reset(vf.opts.Wait)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-vf.wait.C():
		return nil
	}
}

// sendProbe sends one probe for a: an ARP probe on the guard's socket, or a
// neighbour solicitation to its solicited-node group.
func (l *L2) sendProbe(vf *verification, w *wireConn, a netip.Addr) error {
	if a.Is4() {
		p, err := arp.NewPacket(arp.OperationRequest, w.ifi.HardwareAddr, netip.IPv4Unspecified(), make(net.HardwareAddr, 6), a)
		if err != nil {
			return err
		}
		pb, err := p.MarshalBinary()
		if err != nil {
			return err
		}
		f := ethernet.Frame{Destination: ethernet.Broadcast, Source: w.ifi.HardwareAddr, EtherType: ethernet.EtherTypeARP, Payload: pb}
		fb, err := f.MarshalBinary()
		if err != nil {
			return err
		}
		if err := w.raw.SendLinkLayer(fb, w.ifi.Index, unix.ETH_P_ARP, ethernet.Broadcast); err != nil {
			return fmt.Errorf("ARP probe for %s: %w", a, err)
		}
		return nil
	}
	if vf.ndp == nil || vf.ndpIndex != w.ifi.Index {
		if vf.ndp != nil {
			_ = vf.ndp.Close()
		}
		c, _, err := ndp.Listen(ndpInterface(w.ifi), ndp.LinkLocal)
		if err != nil {
			c, _, err = ndp.Listen(ndpInterface(w.ifi), ndp.Unspecified)
		}
		if err != nil {
			vf.ndp = nil
			return fmt.Errorf("neighbour probe on %s: %w", w.ifi.Name, err)
		}
		// It only sends: nothing is queued on it.
		var none ipv6.ICMPFilter
		none.SetAll(true)
		if err := c.SetICMPFilter(&none); err != nil {
			_ = c.Close()
			return fmt.Errorf("neighbour probe on %s: %w", w.ifi.Name, err)
		}
		vf.ndp, vf.ndpIndex = c, w.ifi.Index
	}
	snm, err := ndp.SolicitedNodeMulticast(a)
	if err != nil {
		return err
	}
	ns := &ndp.NeighborSolicitation{TargetAddress: a,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: w.ifi.HardwareAddr}}}
	if err := vf.ndp.WriteTo(ns, nil, snm); err != nil {
		_ = vf.ndp.Close()
		vf.ndp = nil
		return fmt.Errorf("neighbour probe for %s: %w", a, err)
	}
	return nil
}

// awaited reports whether the current round waits for an answer for a.
func (l *L2) awaited(a netip.Addr) bool {
	l.vmu.Lock()
	defer l.vmu.Unlock()
	if l.verify == nil || l.verify.round == nil {
		return false
	}
	_, ok := l.verify.round[a]
	return ok
}

// answered notes that mac, another host's, answered for a in the current
// round.
func (l *L2) answered(a netip.Addr, mac net.HardwareAddr) {
	l.vmu.Lock()
	defer l.vmu.Unlock()
	if l.verify != nil && l.verify.round != nil {
		if macs, ok := l.verify.round[a]; ok {
			macs[mac.String()] = true
		}
	}
}

// Duplicate is two or more hosts answering one verification round for a
// VIP that another node holds: seen from a node that does not hold it.
type Duplicate struct {
	Addr  netip.Addr `json:"address"`
	MACs  []string   `json:"macs"`
	First time.Time  `json:"first"`
	Last  time.Time  `json:"last"`
}

// dupQuiet ends a duplicate episode: not seen for this long.
const dupQuiet = 10 * time.Second

// duplicate records that several MACs answered one round for a: a
// conflict seen from a node that does not hold the VIP (RFC 5227 on every
// node): counted and logged once per episode (new MACs, or after
// dupQuiet), shown in /status.
func (l *L2) duplicate(vf *verification, a netip.Addr, macs []string) {
	now := time.Now()
	l.vmu.Lock()
	d := vf.dups[a]
	fresh := d == nil || !slices.Equal(d.MACs, macs) || now.Sub(d.Last) >= dupQuiet
	if fresh {
		d = &Duplicate{Addr: a, MACs: macs, First: now}
		vf.dups[a] = d
	}
	d.Last = now
	l.vmu.Unlock()
	if !fresh {
		return
	}
	vf.dupCount.WithLabelValues(l.prefixOf(vf, a).String()).Inc()
	l.log.Warn("VIP conflict: more than one host answers for a VIP another node holds", "vip", a, "macs", strings.Join(macs, ","), "interface", l.ifname)
}

// verdict acts on one change of a verdict.
func (l *L2) verdict(vf *verification, d conflict.Verdict) {
	p := l.prefixOf(vf, d.Addr)
	v := p.String()
	l.vmu.Lock()
	kind := vf.kindOf[d.Addr]
	l.vmu.Unlock()
	if kind != "" {
		l.kindVerdict(vf, kind, p, d)
		return
	}
	if !d.Self {
		holder := d.Holder
		if holder == UnknownHolder {
			holder = ""
		}
		vf.opts.Peers.SetUnverified(v, holder, d.Unreachable)
		if d.Unreachable {
			vf.unreach.WithLabelValues(v).Set(1)
			l.log.Warn("VIP unreachable through its holder: its ARP / neighbour answers do not arrive here (reported to the cluster)",
				"vip", d.Addr, "holder", d.Holder, "interface", l.ifname)
		} else {
			vf.unreach.WithLabelValues(v).Set(0)
			l.log.Info("VIP reachable through its holder", "vip", d.Addr, "holder", d.Holder)
		}
		return
	}
	if vf.opts.ElectionMoves {
		if d.Unreachable {
			vf.unverify.WithLabelValues(v).Set(1)
			l.log.Warn("most other nodes report they cannot reach a VIP this node holds: the election moves it",
				"vip", d.Addr, "reporters", strings.Join(d.Reporters, ","), "interface", l.ifname)
		} else {
			vf.unverify.WithLabelValues(v).Set(0)
		}
		return
	}
	l.vmu.Lock()
	if d.Unreachable {
		vf.given[d.Addr] = true
		vf.denied[d.Addr] = fmt.Sprintf("%s cannot reach it", strings.Join(d.Reporters, ", "))
	} else {
		delete(vf.denied, d.Addr)
	}
	l.vmu.Unlock()
	if !d.Unreachable {
		vf.unverify.WithLabelValues(v).Set(0)
		return
	}
	vf.unverify.WithLabelValues(v).Set(1)
	vf.gaveUp.WithLabelValues(v).Inc()
	l.log.Warn("the other nodes cannot reach a VIP this node holds: its announcements do not arrive; giving it up to another node",
		"vip", d.Addr, "reporters", strings.Join(d.Reporters, ","), "interface", l.ifname)
	// The driver checks the held VIPs at once (Check: ErrUnverified).
	select {
	case l.poke <- struct{}{}:
	default:
	}
}

// lostUnverified: the election moved a away from this node; when most of
// the other nodes were reporting that they cannot reach it through this
// node, that is why: said and counted as when this node gives it up
// itself (the lease election's leader moves it on the reports).
func (l *L2) lostUnverified(vf *verification, a netip.Addr) {
	p := l.prefixOf(vf, a)
	reporters, others := vf.opts.Peers.UnverifiedBy(p.String())
	l.vmu.Lock()
	gaveUp := vf.given[a]
	delete(vf.given, a)
	if was := vf.reported[p.String()]; 2*len(reporters) <= others && 2*len(was) > vf.reportOthers {
		reporters, others = was, vf.reportOthers
	}
	l.vmu.Unlock()
	// The election may say so itself (the reporters withdraw their
	// reports as soon as they reach the new holder, which may be one of
	// them: the reports alone can be gone by now).
	excluded := false
	if x, ok := vf.opts.Peers.(interface{ Excluded(vip string) bool }); ok {
		excluded = x.Excluded(p.String())
	}
	if gaveUp || !excluded && (others == 0 || 2*len(reporters) <= others) {
		return
	}
	l.vmu.Lock()
	kind := vf.kindOf[a]
	l.vmu.Unlock()
	if kind != "" {
		vf.kindMoved.WithLabelValues(kind).Inc()
		l.log.Warn("the other nodes cannot reach an address this node held: its announcements do not arrive; the election moved it to another node",
			"address", a, "kind", kind, "reporters", strings.Join(reporters, ","), "interface", l.ifname)
		return
	}
	vf.gaveUp.WithLabelValues(p.String()).Inc()
	l.log.Warn("the other nodes cannot reach a VIP this node holds: its announcements do not arrive; the election moved it to another node",
		"vip", a, "reporters", strings.Join(reporters, ","), "interface", l.ifname)
}

// UnknownHolder names the holder of an address held by another node that
// the election does not name (pool and egress addresses under the lease
// election): verified all the same; its reports name no holder.
const UnknownHolder = "another node"

// kindAddrs: the addresses of one kind, and those this node holds.
type kindAddrs struct {
	all  map[netip.Addr]bool
	held map[netip.Addr]bool
	bad  map[netip.Addr]bool // unreachable from here
}

// SetKindAddresses tells the verification every address of kind ("pool",
// "egress") the cluster places, as host prefixes; SetKindHeld which of
// them this node holds. The others are verified as held by another node,
// batched with the VIPs (at most conflict.VerifyMaxRound a round). Never
// blocks.
func (l *L2) SetKindAddresses(kind string, all []netip.Addr) {
	l.vmu.Lock()
	vf := l.verify
	if vf == nil {
		l.vmu.Unlock()
		return
	}
	k := vf.kind(kind)
	next := make(map[netip.Addr]bool, len(all))
	for _, a := range all {
		next[a.Unmap()] = true
	}
	for a := range k.all {
		if !next[a] {
			vf.setKindHolder(k, kind, a, false)
		}
	}
	k.all = next
	for a := range next {
		vf.setKindHolder(k, kind, a, true)
	}
	vf.kindGauges(k, kind)
	l.vmu.Unlock()
	l.kickVerify(vf)
}

// SetKindHeld replaces the addresses of kind this node holds.
func (l *L2) SetKindHeld(kind string, held []netip.Addr) {
	l.vmu.Lock()
	vf := l.verify
	if vf == nil {
		l.vmu.Unlock()
		return
	}
	k := vf.kind(kind)
	k.held = make(map[netip.Addr]bool, len(held))
	for _, a := range held {
		k.held[a.Unmap()] = true
	}
	for a := range k.all {
		vf.setKindHolder(k, kind, a, true)
	}
	vf.kindGauges(k, kind)
	l.vmu.Unlock()
	l.kickVerify(vf)
}

func (l *L2) kickVerify(vf *verification) {
	select {
	case vf.kick <- struct{}{}:
	default:
	}
}

// kind returns the state of kind (vmu held).
func (vf *verification) kind(kind string) *kindAddrs {
	k := vf.kinds[kind]
	if k == nil {
		k = &kindAddrs{all: map[netip.Addr]bool{}, held: map[netip.Addr]bool{}, bad: map[netip.Addr]bool{}}
		vf.kinds[kind] = k
		vf.kindUnr.WithLabelValues(kind).Set(0)
		vf.kindCount.WithLabelValues(kind).Set(0)
		vf.kindMoved.WithLabelValues(kind).Add(0)
	}
	return k
}

// setKindHolder queues what the verifier must know of a (vmu held): held
// by another node, by this node (not verified here: the others verify
// it), or gone (present false).
func (vf *verification) setKindHolder(k *kindAddrs, kind string, a netip.Addr, present bool) {
	if _, core := vf.prefix[a]; core && vf.kindOf[a] == "" {
		return // a VIP of the core (SetHolder) is never a pool address
	}
	name := ""
	self := present && k.held[a]
	if present && !self {
		name = UnknownHolder
	}
	_, known := vf.kindOf[a]
	if present && known && vf.holder[a] == name && vf.self[a] == self || !present && !known {
		return
	}
	if vf.self[a] && !self {
		vf.lost[a] = true
	}
	vf.self[a] = self
	vf.holder[a] = name
	vf.kindOf[a] = kind
	vf.prefix[a] = hostPrefix(a)
	if name == "" {
		delete(k.bad, a)
	}
	if !present {
		vf.drop[a] = true // forgotten once the verifier was told
	} else {
		delete(vf.drop, a)
	}
	vf.queue[a] = conflict.Holder{Addr: a, Name: name}
}

// kindGauges updates the gauges of kind (vmu held).
func (vf *verification) kindGauges(k *kindAddrs, kind string) {
	others := 0
	for b := range k.all {
		if !k.held[b] {
			others++
		}
	}
	vf.kindCount.WithLabelValues(kind).Set(float64(others))
	vf.kindUnr.WithLabelValues(kind).Set(float64(len(k.bad)))
}

// kindVerdict acts on a verdict on a pool or egress address: reported to
// the cluster without a holder name, counted per kind.
func (l *L2) kindVerdict(vf *verification, kind string, p netip.Prefix, d conflict.Verdict) {
	if d.Self {
		return // never fed as held here
	}
	vf.opts.Peers.SetUnverified(p.String(), "", d.Unreachable)
	l.vmu.Lock()
	k := vf.kind(kind)
	if d.Unreachable {
		k.bad[d.Addr] = true
	} else {
		delete(k.bad, d.Addr)
	}
	n := len(k.bad)
	l.vmu.Unlock()
	vf.kindUnr.WithLabelValues(kind).Set(float64(n))
	if d.Unreachable {
		l.log.Warn("address unreachable through its holder: its ARP / neighbour answers do not arrive here (reported to the cluster)",
			"address", d.Addr, "kind", kind, "interface", l.ifname)
	} else {
		l.log.Info("address reachable through its holder", "address", d.Addr, "kind", kind)
	}
}

// SetOverlap agrees a second holder of vip until until (zero: ends it): a
// make-before-break transfer, in which the old and the new holder both
// answer for a bounded time. On a node that binds vip the conflict guard
// takes claims from macs (from any MAC when none is given) for no
// conflict; on the others the verification reports no duplicate for vip
// meanwhile. Call it on every node, before the overlap begins.
func (l *L2) SetOverlap(ctx context.Context, vip netip.Prefix, until time.Time, macs ...net.HardwareAddr) {
	ms := make([]string, len(macs))
	for i, m := range macs {
		ms[i] = m.String()
	}
	l.guardStep(ctx, conflict.Overlap{Addr: vip.Addr(), MACs: ms, Until: until})
	l.vmu.Lock()
	if l.verify != nil {
		if until.After(time.Now()) {
			l.verify.overlap[vip.Addr()] = until
		} else {
			delete(l.verify.overlap, vip.Addr())
		}
	}
	l.vmu.Unlock()
}
