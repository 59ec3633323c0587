package bgp

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fakeBinder struct {
	mu    sync.Mutex
	bound map[netip.Prefix]bool
}

func (f *fakeBinder) Bind(v netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bound[v] = true
	return nil
}

func (f *fakeBinder) Unbind(v netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.bound, v)
	return nil
}

func (f *fakeBinder) Bound(v netip.Prefix) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bound[v], nil
}

// router is a GoBGP instance on loopback standing in for the upstream
// router (the FRR tests in test/bgp use the real thing).
type router struct {
	srv  *server.BgpServer
	port uint16
}

func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func startRouter(t *testing.T, ctx context.Context, peerAS uint32, v6 bool) *router {
	t.Helper()
	r := &router{srv: server.NewBgpServer(server.LoggerOption(slogBridge{l: slog.New(slog.NewTextHandler(io.Discard, nil))})), port: freePort(t)}
	go r.srv.Serve()
	t.Cleanup(r.srv.Stop)
	addrs := []string{"127.0.0.1"}
	if v6 {
		addrs = append(addrs, "::1")
	}
	if err := r.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn: 65000, RouterId: "192.0.2.254", ListenPort: int32(r.port), ListenAddresses: addrs,
	}}); err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		fam := family(netip.MustParseAddr(a))
		if err := r.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{
			Conf:      &api.PeerConf{NeighborAddress: a, PeerAsn: peerAS},
			Transport: &api.Transport{PassiveMode: true},
			Timers:    &api.Timers{Config: &api.TimersConfig{HoldTime: 9, KeepaliveInterval: 3}},
			AfiSafis:  []*api.AfiSafi{{Config: &api.AfiSafiConfig{Family: fam, Enabled: true}}},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// nextHops returns the next hops the router has for vip (empty: no path).
func (r *router) nextHops(t *testing.T, vip netip.Prefix) []string {
	t.Helper()
	var hops []string
	err := r.srv.ListPath(context.Background(), &api.ListPathRequest{
		TableType: api.TableType_GLOBAL, Family: family(vip.Addr()),
		Prefixes: []*api.TableLookupPrefix{{Prefix: vip.String(), Type: api.TableLookupPrefix_EXACT}},
	}, func(d *api.Destination) {
		for _, p := range d.Paths {
			for _, a := range p.Pattrs {
				var nh api.NextHopAttribute
				var mp api.MpReachNLRIAttribute
				switch {
				case a.MessageIs(&nh) && a.UnmarshalTo(&nh) == nil:
					hops = append(hops, nh.NextHop)
				case a.MessageIs(&mp) && a.UnmarshalTo(&mp) == nil:
					hops = append(hops, mp.NextHops...)
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return hops
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitOK(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func established(s *Speaker, peer string) bool {
	for _, p := range s.Status(context.Background()).Peers {
		if p.Peer == peer {
			return p.Established
		}
	}
	return false
}

func ipv6Loopback(t *testing.T) bool {
	t.Helper()
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

func TestSpeakerAgainstRouter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	v6 := ipv6Loopback(t)
	rt := startRouter(t, ctx, 65001, v6)
	peers := []Peer{{Address: netip.MustParseAddr("127.0.0.1"), AS: 65000, Port: rt.port}}
	if v6 {
		peers = append(peers, Peer{Address: netip.MustParseAddr("::1"), AS: 65000, Port: rt.port})
	}
	binder := &fakeBinder{bound: map[netip.Prefix]bool{}}
	reg := prometheus.NewRegistry()
	var logs strings.Builder
	var logMu sync.Mutex
	lw := writerFunc(func(p []byte) (int, error) { logMu.Lock(); defer logMu.Unlock(); return logs.Write(p) })
	sp, err := Start(ctx, Config{LocalAS: 65001, RouterID: netip.MustParseAddr("192.0.2.11"), Peers: peers},
		Options{Logger: slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelDebug})), Registerer: reg, Binder: binder})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	p4 := peers[0].String()
	waitFor(t, "IPv4 session established", 20*time.Second, func() bool { return established(sp, p4) })
	if got := testutil.ToFloat64(gaugeVec(t, reg, "vipd_bgp_peer_up", map[string]string{"peer": p4})); got != 1 {
		t.Errorf("vipd_bgp_peer_up{peer=%s} = %v, want 1", p4, got)
	}

	vip := netip.MustParsePrefix("203.0.113.10/32")
	other := netip.MustParsePrefix("203.0.113.11/32")
	for range 3 { // idempotent
		if err := sp.Acquire(ctx, vip); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.Acquire(ctx, other); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "router learns the VIP", 10*time.Second, func() bool { return len(rt.nextHops(t, vip)) == 1 })
	if hops := rt.nextHops(t, vip); hops[0] != "127.0.0.1" {
		t.Errorf("next hop %v, want the session address 127.0.0.1", hops)
	}
	if ok, err := sp.Present(ctx, vip); err != nil || !ok {
		t.Errorf("Present after Acquire = %v, %v", ok, err)
	}
	waitFor(t, "advertised metric", 5*time.Second, func() bool {
		return testutil.ToFloat64(gaugeVec(t, reg, "vipd_bgp_advertised", map[string]string{"vip": vip.String(), "peer": p4})) == 1
	})

	// A route the router sends is received (Adj-RIB-In) but never imported.
	learned := netip.MustParsePrefix("198.51.100.0/24")
	if err := addRoute(ctx, rt.srv, learned); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "route received from the router", 10*time.Second, func() bool { return countPaths(t, sp.srv, api.TableType_ADJ_IN, "127.0.0.1", learned) == 1 })
	if n := countPaths(t, sp.srv, api.TableType_GLOBAL, "", learned); n != 0 {
		t.Errorf("learned route imported into the speaker's RIB (%d paths)", n)
	}

	// Releasing one VIP withdraws that one only.
	for range 2 {
		if err := sp.Release(ctx, vip); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "router drops the VIP", 10*time.Second, func() bool { return len(rt.nextHops(t, vip)) == 0 })
	if got := testutil.ToFloat64(gaugeVec(t, reg, "vipd_bgp_advertised", map[string]string{"vip": vip.String(), "peer": p4})); got != 0 {
		t.Errorf("vipd_bgp_advertised after Release = %v, want 0", got)
	}
	if hops := rt.nextHops(t, other); len(hops) != 1 {
		t.Errorf("releasing %s also removed %s (hops %v)", vip, other, hops)
	}
	if ok, _ := binder.Bound(vip); ok {
		t.Error("VIP still bound after Release")
	}
	if ok, err := sp.Present(ctx, vip); err != nil || ok {
		t.Errorf("Present after Release = %v, %v", ok, err)
	}
	// Present needs both halves: an address bound by someone else is not enough.
	_ = binder.Bind(vip)
	if ok, _ := sp.Present(ctx, vip); ok {
		t.Error("Present true with the VIP bound but not advertised")
	}

	// A hard reset drops the session at once and it comes back by itself.
	if err := sp.ResetPeer(ctx, peers[0].Address, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "session reset", 5*time.Second, func() bool { return !established(sp, p4) })
	waitFor(t, "session back after reset", 15*time.Second, func() bool { return established(sp, p4) })
	waitFor(t, "remaining VIP re-advertised", 10*time.Second, func() bool { return len(rt.nextHops(t, other)) == 1 })
	if st := sp.Status(ctx); st.Peers[0].Flaps < 1 {
		t.Errorf("flaps = %d after a reset, want >= 1", st.Peers[0].Flaps)
	}

	// Disable keeps the session down (a reset would reconnect after the 1 s
	// idle hold); Enable brings it back.
	if err := sp.DisablePeer(ctx, peers[0].Address, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "session down after disable", 5*time.Second, func() bool { return !established(sp, p4) })
	waitFor(t, "router drops the path of a disabled session", 10*time.Second, func() bool { return len(rt.nextHops(t, other)) == 0 })
	time.Sleep(2500 * time.Millisecond)
	if established(sp, p4) {
		t.Fatal("disabled peer reconnected")
	}
	if err := sp.EnablePeer(ctx, peers[0].Address); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "session back after enable", 15*time.Second, func() bool { return established(sp, p4) })
	waitFor(t, "VIP re-advertised after enable", 10*time.Second, func() bool { return len(rt.nextHops(t, other)) == 1 })

	if v6 {
		vip6 := netip.MustParsePrefix("2001:db8:ffff::10/128")
		if !waitOK(20*time.Second, func() bool { return established(sp, peers[1].String()) }) {
			logMu.Lock()
			t.Fatalf("IPv6 session not established:\n%s", logs.String())
		}
		if err := sp.Acquire(ctx, vip6); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "router learns the IPv6 VIP", 10*time.Second, func() bool { return len(rt.nextHops(t, vip6)) == 1 })
		if hops := rt.nextHops(t, vip6); hops[0] != "::1" {
			t.Errorf("IPv6 next hop %v, want the session address ::1", hops)
		}
		// The IPv6 VIP is not sent over the IPv4 session.
		if n := countPaths(t, sp.srv, api.TableType_ADJ_OUT, "127.0.0.1", vip6); n != 0 {
			t.Errorf("IPv6 VIP sent to the IPv4 peer")
		}
		if err := sp.Release(ctx, vip6); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "router drops the IPv6 VIP", 10*time.Second, func() bool { return len(rt.nextHops(t, vip6)) == 0 })
	} else {
		t.Log("no IPv6 loopback: IPv6 part skipped")
	}

	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "router drops paths when the speaker closes", 10*time.Second, func() bool { return len(rt.nextHops(t, other)) == 0 })
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), "bgp peer state") || !strings.Contains(logs.String(), "to=established") {
		t.Errorf("peer state changes not logged:\n%s", logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func addRoute(ctx context.Context, s *server.BgpServer, pfx netip.Prefix) error {
	p, err := vipPath(pfx, Attributes{}, 65001)
	if err != nil {
		return err
	}
	_, err = s.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: p})
	return err
}

func countPaths(t *testing.T, s *server.BgpServer, tt api.TableType, name string, pfx netip.Prefix) int {
	t.Helper()
	n := 0
	_ = s.ListPath(context.Background(), &api.ListPathRequest{
		TableType: tt, Name: name, Family: family(pfx.Addr()),
		Prefixes: []*api.TableLookupPrefix{{Prefix: pfx.String(), Type: api.TableLookupPrefix_EXACT}},
	}, func(d *api.Destination) { n += len(d.Paths) })
	return n
}

// gaugeVec gathers reg and returns the one metric with these labels as a
// collector usable with testutil.ToFloat64 (a constant gauge).
func gaugeVec(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue metrics
				}
			}
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
			g.Set(m.GetGauge().GetValue())
			return g
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
	g.Set(-1) // absent
	return g
}
