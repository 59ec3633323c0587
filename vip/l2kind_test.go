package vip

import (
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipd/vipd/vip/conflict"
)

type fakePeers struct {
	mu  sync.Mutex
	set map[string]string // vip -> holder reported unreachable
}

func (f *fakePeers) SetUnverified(vip, holder string, unreachable bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if unreachable {
		f.set[vip] = holder
	} else {
		delete(f.set, vip)
	}
}
func (f *fakePeers) UnverifiedBy(string) ([]string, int)  { return nil, 0 }
func (f *fakePeers) MemberAddr(string) (netip.Addr, bool) { return netip.Addr{}, false }

// TestKindAddresses: 1,000 pool addresses, ten held here: the other 990
// are fed to the verifier as held by a node not named, the held ones are
// not verified here; verdicts on them are reported without a holder and
// counted per kind, never with a per-address metric; an address that
// leaves the pool is forgotten.
func TestKindAddresses(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, err := NewL2(L2Options{Interface: "lo"}, testLog(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	peers := &fakePeers{set: map[string]string{}}
	if err := l.EnableVerify(VerifyOptions{Peers: peers}, reg); err != nil {
		t.Fatal(err)
	}
	var all, held []netip.Addr
	base := netip.MustParseAddr("10.9.0.0")
	a := base
	for i := 0; i < 1000; i++ {
		a = a.Next()
		all = append(all, a)
		if i < 10 {
			held = append(held, a)
		}
	}
	l.SetKindAddresses("pool", all)
	l.SetKindHeld("pool", held)
	vf := l.verify
	others, mine := 0, 0
	for _, h := range vf.queue {
		switch h.Name {
		case UnknownHolder:
			others++
		case "":
			mine++
		}
	}
	if others != 990 || mine != 10 {
		t.Fatalf("queued %d held elsewhere, %d here; want 990, 10", others, mine)
	}
	if got := testutil.ToFloat64(vf.kindCount.WithLabelValues("pool")); got != 990 {
		t.Fatalf("vipd_addresses_verified = %v, want 990", got)
	}
	// A verdict: reported without a holder, counted per kind.
	bad := all[500]
	l.verdict(vf, conflict.Verdict{Addr: bad, Holder: UnknownHolder, Unreachable: true})
	if h, ok := peers.set[hostPrefix(bad).String()]; !ok || h != "" {
		t.Fatalf("reports %v, want %s without a holder", peers.set, bad)
	}
	if got := testutil.ToFloat64(vf.kindUnr.WithLabelValues("pool")); got != 1 {
		t.Fatalf("vipd_addresses_unreachable = %v, want 1", got)
	}
	n, err := testutil.GatherAndCount(reg, "vipd_vip_unreachable", "vipd_vip_unverified", "vipd_vip_unverified_total", "vipd_duplicate_answers_total")
	if err != nil || n != 0 {
		t.Fatalf("%d per-address verification series for pool addresses (%v)", n, err)
	}
	// The address leaves the pool: its report is withdrawn (by the
	// verifier's holder change) and it is forgotten.
	l.SetKindAddresses("pool", append(all[:500:500], all[501:]...))
	if h := vf.queue[bad]; h.Name != "" {
		t.Fatalf("queued %+v for the address gone", h)
	}
	l.verdict(vf, conflict.Verdict{Addr: bad})
	if _, ok := peers.set[hostPrefix(bad).String()]; ok {
		t.Fatal("the report on the address gone stays")
	}
	if got := testutil.ToFloat64(vf.kindUnr.WithLabelValues("pool")); got != 0 {
		t.Fatalf("vipd_addresses_unreachable = %v after the address left, want 0", got)
	}
	if !strings.Contains(vf.kindOf[bad], "pool") {
		t.Fatalf("kindOf forgotten before the verifier was told: %q", vf.kindOf[bad])
	}
}
