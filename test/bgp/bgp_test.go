package bgp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// TestECMPFailuresAndRecovery is the main bgp-mode story against FRR with
// BFD 300 ms x 3 on both sides: ECMP over three nodes for an IPv4 and an
// IPv6 VIP (IPv6 over IPv6 sessions), health-driven withdrawal, a silent
// node caught by BFD, vipd restarts and an FRR restart.
func TestECMPFailuresAndRecovery(t *testing.T) {
	testenvShort(t)
	e := newEnv(t, setup{nodes: 3, bfd: &lab.BFDProfile{ReceiveInterval: 300, TransmitInterval: 300, DetectMultiplier: 3},
		vipdEnv: []string{"VIPD_BFD_ENABLED=true", "VIPD_BFD_TX_INTERVAL=300ms", "VIPD_BFD_RX_INTERVAL=300ms", "VIPD_BFD_DETECT_MULT=3"}})
	e.startAll()
	n1, n2, n3 := e.nodes[0], e.nodes[1], e.nodes[2]
	all := e.nodes

	t.Run("ecmp", func(t *testing.T) {
		e.t = t
		e.waitBGP(vip4, 30*time.Second, all...)
		e.waitKernel(vip4, 10*time.Second, all...)
		e.waitBGP(vip6, 30*time.Second, all...)
		e.waitKernel(vip6, 10*time.Second, all...)
		// Traffic to the VIP from the router reaches a node's apiserver
		// through the VIP bound on that node's lo. (curl, not Host.Probe:
		// see probeVIP.)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, v := range []netip.Prefix{vip4, vip6} {
			name, err := probeVIP(ctx, e.r, v)
			if err != nil || !strings.HasPrefix(name, "n") {
				t.Errorf("probe %s from the router: %q, %v", v, name, err)
			}
		}
	})

	t.Run("bfd-up-at-negotiated-intervals", func(t *testing.T) {
		e.t = t
		var peers []lab.BFDPeer
		ok := poll(15*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var err error
			peers, err = e.frr.BFDPeers(ctx)
			if err != nil || len(peers) != 6 {
				return false
			}
			// Up is reached at the slow rate (RFC 5880 6.8.3: >= 1 s
			// while not Up); the Poll sequence that moves both sides to
			// 300 ms follows, so FRR can report a session up with the
			// remote's 1 s for a packet or two (CI, bacc8cd).
			for _, p := range peers {
				if p.Status != "up" || p.RemoteReceiveInterval != 300 || p.RemoteTransmitInterval != 300 || p.RemoteDetectMultiplier != 3 {
					return false
				}
			}
			return true
		})
		if !ok {
			t.Fatalf("want 6 BFD sessions up (3 nodes x IPv4/IPv6) at remote rx/tx 300 ms x 3, got %+v", peers)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Metrics and /status report the sessions and the advertisement.
		m, err := metrics(ctx, n1.h)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			fmt.Sprintf(`vipd_bgp_peer_up{peer="%s"} 1`, e.r.IPv4),
			fmt.Sprintf(`vipd_bgp_peer_up{peer="%s"} 1`, e.r.IPv6),
			fmt.Sprintf(`vipd_bgp_advertised{peer="%s",vip="%s"} 1`, e.r.IPv4, vip4),
			fmt.Sprintf(`vipd_bgp_advertised{peer="%s",vip="%s"} 1`, e.r.IPv6, vip6),
			fmt.Sprintf(`vipd_bfd_session_up{peer="%s"} 1`, e.r.IPv4),
		} {
			if !strings.Contains(m, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
		raw, err := statusJSON(ctx, n1.h)
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Components struct {
				BGP struct {
					Peers []struct {
						Peer        string   `json:"peer"`
						Established bool     `json:"established"`
						Advertised  []string `json:"advertised"`
					} `json:"peers"`
				} `json:"bgp"`
			} `json:"components"`
		}
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			t.Fatalf("/status: %v\n%s", err, raw)
		}
		if p := st.Components.BGP.Peers; len(p) != 2 || !p[0].Established || !p[1].Established ||
			!slices.Equal(p[0].Advertised, []string{vip4.String()}) || !slices.Equal(p[1].Advertised, []string{vip6.String()}) {
			t.Errorf("/status bgp peers = %+v, want both established, IPv4 VIP to the IPv4 peer, IPv6 VIP to the IPv6 peer", p)
		}
	})

	t.Run("apiserver-fails-path-withdrawn", func(t *testing.T) {
		e.t = t
		if err := n2.api.SetMode(lab.Failing); err != nil {
			t.Fatal(err)
		}
		e.waitKernel(vip4, 10*time.Second, n1, n3)
		e.waitKernel(vip6, 10*time.Second, n1, n3)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if m, err := metrics(ctx, n2.h); err != nil || !strings.Contains(m, fmt.Sprintf(`vipd_bgp_advertised{peer="%s",vip="%s"} 0`, e.r.IPv4, vip4)) {
			t.Errorf("unhealthy node's metrics do not show the VIP withdrawn (%v)", err)
		}
		// The node no longer accepts the VIP's traffic either.
		if out, _ := n2.h.Output(ctx, "ip", "addr", "show", "dev", "lo"); strings.Contains(string(out), vip4.Addr().String()) {
			t.Errorf("unhealthy node still has the VIP on lo:\n%s", out)
		}
		if err := n2.api.SetMode(lab.OK); err != nil {
			t.Fatal(err)
		}
		e.waitKernel(vip4, 10*time.Second, all...)
		e.waitKernel(vip6, 10*time.Second, all...)
	})

	t.Run("silent-node-dropped-by-bfd", func(t *testing.T) {
		e.t = t
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		start := time.Now()
		if err := silence(ctx, n3.h, true); err != nil {
			t.Fatal(err)
		}
		// BFD 300 ms x 3 is 0.9 s; the BGP hold timer alone would take 9 s.
		e.waitKernel(vip4, 4*time.Second, n1, n2)
		t.Logf("silent node's path gone from the router's FIB after %v", time.Since(start).Round(time.Millisecond))
		// The node's own BFD saw the router go quiet and reset the BGP session.
		if !poll(5*time.Second, func() bool {
			out := n3.vipd.Output()
			return strings.Contains(out, "bgp peer reset") && strings.Contains(out, "BFD down: control-detection-time-expired")
		}) {
			t.Errorf("silenced node's vipd did not reset its BGP session on BFD Down:\n%s", tail(n3.vipd.Output(), 20))
		}
		if err := silence(ctx, n3.h, false); err != nil {
			t.Fatal(err)
		}
		e.waitKernel(vip4, 45*time.Second, all...)
		e.waitKernel(vip6, 45*time.Second, all...)
	})

	t.Run("vipd-restart-leaves-no-stale-path", func(t *testing.T) {
		e.t = t
		// Planned stop: withdrawn at once, nothing left behind.
		if err := n1.vipd.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		e.waitKernel(vip4, 5*time.Second, n2, n3)
		if code, err := n1.vipd.Wait(10 * time.Second); err != nil || code != 0 {
			t.Errorf("vipd exit after SIGTERM: %d, %v\n%s", code, err, tail(n1.vipd.Output(), 30))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if out, _ := n1.h.Output(ctx, "ip", "addr", "show", "dev", "lo"); strings.Contains(string(out), vip4.Addr().String()) {
			t.Errorf("stopped vipd left the VIP on lo:\n%s", out)
		}
		start := time.Now()
		e.startVipd(n1)
		e.waitKernel(vip4, 30*time.Second, all...)
		t.Logf("restarted vipd's path in the router's FIB after %v", time.Since(start).Round(time.Millisecond))
		// Crash: the session drops with the process; the restarted vipd
		// advertises once, with no duplicate or stale path.
		n1.vipd.Kill()
		e.waitBGP(vip4, 15*time.Second, n2, n3)
		e.startVipd(n1)
		e.waitBGP(vip4, 30*time.Second, all...)
		e.waitKernel(vip4, 10*time.Second, all...)
		e.waitBGP(vip6, 30*time.Second, all...)
	})

	t.Run("frr-restart-recovers", func(t *testing.T) {
		e.t = t
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		e.frr.Stop()
		// zebra took its routes with it: the test below sees them come back.
		e.waitKernel(vip4, 5*time.Second)
		start := time.Now()
		if err := e.frr.Start(ctx); err != nil {
			t.Fatal(err)
		}
		e.waitKernel(vip4, 45*time.Second, all...)
		e.waitKernel(vip6, 45*time.Second, all...)
		t.Logf("all paths back %v after FRR started again", time.Since(start).Round(time.Millisecond))
		// BFD comes back too (FRR creates its sessions once BGP is up).
		ok := poll(15*time.Second, func() bool {
			peers, err := e.frr.BFDPeers(ctx)
			up := 0
			for _, p := range peers {
				if p.Status == "up" {
					up++
				}
			}
			return err == nil && up == 6
		})
		if !ok {
			t.Error("BFD sessions not all up again after the FRR restart")
		}
	})
}

// TestMD5 checks TCP MD5 sessions: the right password gets the path in, a
// wrong one never establishes.
func TestMD5(t *testing.T) {
	testenvShort(t)
	e := newEnv(t, setup{nodes: 2, password: "s3cret-pw"})
	n1, n2 := e.nodes[0], e.nodes[1]
	peers := func(pw string) string {
		return fmt.Sprintf("VIPD_BGP_PEERS=%s:%d:password=%s,[%s]:%d:password=%s", e.r.IPv4, routerAS, pw, e.r.IPv6, routerAS, pw)
	}
	// n1 also leaves VIPD_BGP_ROUTER_ID unset: it defaults to the node's address.
	e.startVipd(n1, peers("s3cret-pw"), "VIPD_BGP_ROUTER_ID=")
	e.startVipd(n2, peers("wrong-pw"))
	e.waitBGP(vip4, 30*time.Second, n1)
	e.waitBGP(vip6, 30*time.Second, n1)
	// Give the wrong-password node time for several connection attempts.
	time.Sleep(5 * time.Second)
	e.waitBGP(vip4, time.Second, n1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := e.frr.Vtysh(ctx, "show bgp summary json")
	if err != nil {
		t.Fatal(err)
	}
	var sum struct {
		IPv4 struct {
			Peers map[string]struct {
				State string `json:"state"`
			} `json:"peers"`
		} `json:"ipv4Unicast"`
	}
	if err := json.Unmarshal(out, &sum); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if p, ok := sum.IPv4.Peers[n2.h.IPv4.String()]; ok && p.State == "Established" {
		t.Errorf("node with the wrong MD5 password established a session")
	}
	if p := sum.IPv4.Peers[n1.h.IPv4.String()]; p.State != "Established" {
		t.Errorf("node with the right MD5 password: state %q", p.State)
	}
	out, err = e.frr.Vtysh(ctx, "show bgp neighbors "+n1.h.IPv4.String()+" json")
	if err != nil {
		t.Fatal(err)
	}
	var nb map[string]struct {
		RemoteRouterID string `json:"remoteRouterId"`
	}
	if err := json.Unmarshal(out, &nb); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := nb[n1.h.IPv4.String()].RemoteRouterID; got != n1.h.IPv4.String() {
		t.Errorf("default router ID = %q, want the node's address %s", got, n1.h.IPv4)
	}
}

// TestBadPeerSettings: a bad VIPD_BGP_PEERS stops check-config and run with
// one line naming the setting and exit code 2.
func TestBadPeerSettings(t *testing.T) {
	requirePrereqs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "VIPD_MODE=bgp", "VIPD_ADDRESS=198.51.100.10/32",
		"VIPD_BGP_LOCAL_AS=65001", "VIPD_BGP_ROUTER_ID=192.0.2.11", "VIPD_METRICS_ADDRESS=", "VIPD_STATE_DIR=" + t.TempDir()}
	for _, tt := range []struct{ peers, want string }{
		{"192.0.2.1", "missing ':as'"},
		{"192.0.2.1:65000:hold=1", "at least 3s"},
		{"2001:db8::1:65000", "brackets"},
		{"192.0.2.1:65000:bogus=1", `unknown option "bogus"`},
	} {
		for _, sub := range []string{"check-config", "run"} {
			out, code, err := runVipd(ctx, append(base, "VIPD_BGP_PEERS="+tt.peers), sub)
			if err != nil {
				t.Fatal(err)
			}
			out = strings.TrimSpace(out)
			if code != 2 || strings.Count(out, "\n") != 0 || !strings.Contains(out, "VIPD_BGP_PEERS") || !strings.Contains(out, tt.want) ||
				!strings.Contains(out, "address:as[:option=value...]") {
				t.Errorf("vipd %s with VIPD_BGP_PEERS=%s: exit %d, output:\n%s\nwant exit 2 and one line naming VIPD_BGP_PEERS, %q and the form", sub, tt.peers, code, out, tt.want)
			}
		}
	}
}

// TestBadFabricSettings: a bad peers file, password file or path attribute
// stops check-config and run with one line naming the setting, exit code 2,
// and never the password.
func TestBadFabricSettings(t *testing.T) {
	requirePrereqs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const secret = "Sup3r:Secr,t"
	pw := write("pw", secret+"\n")
	long := write("long", strings.Repeat(secret, 8))
	base := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "VIPD_MODE=bgp", "VIPD_ADDRESS=198.51.100.10/32",
		"VIPD_BGP_LOCAL_AS=65001", "VIPD_BGP_ROUTER_ID=192.0.2.11", "VIPD_METRICS_ADDRESS=", "VIPD_STATE_DIR=" + t.TempDir()}
	for _, tt := range []struct {
		env  []string
		want string
	}{
		{[]string{"VIPD_BGP_PEERS_FILE=" + dir + "/missing.yaml"}, "VIPD_BGP_PEERS_FILE"},
		{[]string{"VIPD_BGP_PEERS_FILE=" + write("typo.yaml", "peers:\n  - address: 192.0.2.1\n    as: 65000\n    pasword_file: "+pw+"\n")}, "pasword_file"},
		{[]string{"VIPD_BGP_PEERS_FILE=" + write("vip.yaml", "peers:\n  - {address: 192.0.2.1, as: 65000}\nvips:\n  198.51.100.99/32: {med: 1}\n")}, "not in VIPD_ADDRESS"},
		{[]string{"VIPD_BGP_PEERS_FILE=" + write("long.yaml", "peers:\n  - {address: 192.0.2.1, as: 65000, password_file: "+long+"}\n")}, "1-80"},
		{[]string{"VIPD_BGP_PEERS=192.0.2.1:65000:password-file=" + dir + "/nope"}, "VIPD_BGP_PEERS: peer 192.0.2.1: password file"},
		{[]string{"VIPD_BGP_PEERS=192.0.2.1:65000:password-file=" + pw, "VIPD_BGP_PEERS_FILE=" + dir + "/x.yaml"}, "VIPD_BGP_PEERS_FILE"},
		{[]string{"VIPD_BGP_PEERS=192.0.2.1:65000:password=" + secret[:6] + ":hold=1"}, "password=<redacted>"},
		{[]string{"VIPD_BGP_PEERS=192.0.2.1:65000", "VIPD_BGP_COMMUNITIES=65000:70000"}, "VIPD_BGP_COMMUNITIES"},
		{[]string{"VIPD_BGP_PEERS=192.0.2.1:65000", "VIPD_BGP_LARGE_COMMUNITIES=1:2"}, "VIPD_BGP_LARGE_COMMUNITIES"},
		{[]string{"VIPD_BGP_PEERS=192.0.2.1:65000", "VIPD_BGP_AS_PATH_PREPEND=11"}, "VIPD_BGP_AS_PATH_PREPEND"},
		{[]string{"VIPD_BGP_PEERS=192.0.2.1:65000", "VIPD_BGP_LOCAL_PREF=-1"}, "VIPD_BGP_LOCAL_PREF"},
		{[]string{"VIPD_BGP_PEERS=192.0.2.1:65000", "VIPD_BFD_MULTIHOP_MIN_TTL=0"}, "VIPD_BFD_MULTIHOP_MIN_TTL"},
	} {
		for _, sub := range []string{"check-config", "run"} {
			out, code, err := runVipd(ctx, append(append([]string(nil), base...), tt.env...), sub)
			if err != nil {
				t.Fatal(err)
			}
			out = strings.TrimSpace(out)
			if code != 2 || strings.Count(out, "\n") != 0 || !strings.Contains(out, tt.want) || strings.Contains(out, secret) || strings.Contains(out, secret[:6]) {
				t.Errorf("vipd %s with %v: exit %d, output:\n%s\nwant exit 2 and one line with %q and no password", sub, tt.env, code, out, tt.want)
			}
		}
	}
}
