package vip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	// SetUnverified publishes whether this node can reach vip, held by
	// another node.
	SetUnverified(vip string, unreachable bool)
	// UnverifiedBy returns the other alive members that report they
	// cannot reach vip, and how many other alive members there are.
	UnverifiedBy(vip string) (reporters []string, others int)
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
}

const verifyWait = 300 * time.Millisecond

// verification is the state of the verification on one L2.
type verification struct {
	opts     VerifyOptions
	v        *conflict.Verifier
	next     time.Time
	queue    map[netip.Addr]conflict.Holder // holder changes not yet fed, the latest per address
	prefix   map[netip.Addr]netip.Prefix
	denied   map[netip.Addr]string // VIPs this node holds that the others cannot reach, with why
	kick     chan struct{}
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
	if reg != nil {
		for _, c := range []prometheus.Collector{vf.unreach, vf.unverify, vf.gaveUp, vf.rounds} {
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
	}
	vf.prefix[vip.Addr()] = vip
	vf.queue[vip.Addr()] = conflict.Holder{Addr: vip.Addr(), Name: holder, Self: self}
	l.vmu.Unlock()
	select {
	case vf.kick <- struct{}{}:
	default:
	}
}

// Verification lists what this node knows about the announcements of the
// VIPs, for /status (nil when the verification is off).
func (l *L2) Verification() []conflict.VerifyStatus {
	l.vmu.Lock()
	defer l.vmu.Unlock()
	if l.verify == nil {
		return nil
	}
	return l.verify.v.Status()
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
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-vf.kick:
		case <-timer.C:
		}
		l.vmu.Lock()
		queued := make([]conflict.Event, 0, len(vf.queue))
		for _, h := range vf.queue {
			queued = append(queued, h)
		}
		clear(vf.queue)
		l.vmu.Unlock()
		queued = append(queued, conflict.Tick{})
		for _, ev := range queued {
			l.verifyStep(ctx, vf, ev)
		}
		l.vmu.Lock()
		next := vf.next
		l.vmu.Unlock()
		arm(timer, next)
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
		answered := l.verifyRound(ctx, vf, out.Probe)
		l.verifyStep(ctx, vf, conflict.Probed{Addrs: out.Probe, Answered: answered})
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

// verifyRound resolves the addresses (one batched round of RFC 5227
// probes: answered by the holder's kernel, and never changing a
// neighbour's cache) and, with a port, connects to each address that
// answered. It returns the addresses that passed. A round that cannot be
// sent (the interface is down) answers nothing and says so in the log once
// per failure streak: this node then cannot verify anything, and reports it.
func (l *L2) verifyRound(ctx context.Context, vf *verification, addrs []netip.Addr) map[netip.Addr]bool {
	ok := map[netip.Addr]bool{}
	answers, err := l.probeMany(ctx, addrs, vf.opts.Wait)
	if err != nil {
		l.log.Debug("verification round failed", "interface", l.ifname, "err", err)
		return ok
	}
	for _, a := range addrs {
		if _, answered := answers[a]; !answered {
			continue
		}
		if vf.opts.Port != 0 {
			d := net.Dialer{Timeout: vf.opts.Wait}
			c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(a.String(), strconv.Itoa(int(vf.opts.Port))))
			if err != nil {
				l.log.Debug("verification: cannot connect through the VIP", "vip", a, "port", vf.opts.Port, "err", err)
				continue
			}
			_ = c.Close()
		}
		ok[a] = true
	}
	return ok
}

// verdict acts on one change of a verdict.
func (l *L2) verdict(vf *verification, d conflict.Verdict) {
	p := l.prefixOf(vf, d.Addr)
	v := p.String()
	if !d.Self {
		vf.opts.Peers.SetUnverified(v, d.Unreachable)
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
	l.vmu.Lock()
	if d.Unreachable {
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
