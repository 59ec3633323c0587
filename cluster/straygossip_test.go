package cluster

import (
	"crypto/rand"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The sender each kind of memberlist log line names.
func TestSourceOf(t *testing.T) {
	for _, tc := range []struct {
		line, want string
		ours       bool
	}{
		{"Decrypt packet failed: no installed keys could decrypt the message from=10.0.0.12:7950", "10.0.0.12", false},
		{"Decrypt packet failed: unsupported encryption version 104 from=[fd00::12]:41000", "fd00::12", false},
		{"Decrypt packet failed: no installed keys could decrypt the message from=[::ffff:10.0.0.9]:7950", "10.0.0.9", false},
		{"failed to receive: encryption is configured but remote state is not encrypted from=192.0.2.7:51234", "192.0.2.7", false},
		{"failed to join 10.0.0.13:7950: no installed keys could decrypt the message", "10.0.0.13", true},
		{"failed to join [fd00::13]:7950: no installed keys could decrypt the message", "fd00::13", true},
		{"Decrypt packet failed: payload is too small to decrypt: 3 from=<unknown address>", "", false},
		{"no installed keys could decrypt the message", "", false},
	} {
		got, ours := sourceOf(tc.line)
		if (tc.want == "" && got.IsValid()) || (tc.want != "" && got != netip.MustParseAddr(tc.want)) || ours != tc.ours {
			t.Errorf("sourceOf(%q) = %v %v, want %q %v", tc.line, got, ours, tc.want, tc.ours)
		}
	}
}

// Rejected gossip from a sender that counts (a peer, a member) is an
// error naming the key file, at most once per keyErrorLogEvery; from any
// other sender a warning at most once per strayLogEvery; each repeat is
// counted in the next line. Other lines keep their level.
func TestLog2SlogRejections(t *testing.T) {
	var buf syncBuf
	now := time.Unix(1000, 0)
	peer := netip.MustParseAddr("10.0.0.12")
	var told []netip.Addr
	lg := log2slog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		func(from netip.Addr, ours bool) bool {
			told = append(told, from)
			return ours || from == peer || !from.IsValid()
		},
		func() time.Time { return now })
	seen := 0
	lines := func() []string { l := buf.lines()[seen:]; seen += len(l); return l }

	fromPeer := "[ERR] memberlist: Decrypt packet failed: no installed keys could decrypt the message from=10.0.0.12:7950"
	fromStray := "[ERR] memberlist: Decrypt packet failed: unsupported encryption version 104 from=192.0.2.7:5353"
	lg.Print(fromPeer)
	lg.Print(fromPeer)
	lg.Print(fromStray)
	lg.Print(fromStray)
	got := lines()
	if len(got) != 2 || !strings.Contains(got[0], "level=ERROR") || !strings.Contains(got[0], "VIPD_GOSSIP_KEY_FILE") ||
		!strings.Contains(got[1], "level=WARN") || !strings.Contains(got[1], StrayGossipWarning) || !strings.Contains(got[1], "192.0.2.7") {
		t.Fatalf("first rejections: logged %q, want one error for the peer and one warning for the stray sender", got)
	}
	if len(told) != 4 || told[0] != peer || told[2] != netip.MustParseAddr("192.0.2.7") {
		t.Fatalf("keyMismatch told %v", told)
	}

	now = now.Add(keyErrorLogEvery)
	lg.Print(fromPeer)
	lg.Print(fromStray)
	got = lines()
	if len(got) != 1 || !strings.Contains(got[0], "level=ERROR") || !strings.Contains(got[0], "more_since_last_warning=1") {
		t.Fatalf("after %v: logged %q, want the peer's error again with the one held back", keyErrorLogEvery, got)
	}
	now = now.Add(strayLogEvery)
	lg.Print(fromStray)
	got = lines()
	if len(got) != 1 || !strings.Contains(got[0], StrayGossipWarning) || !strings.Contains(got[0], "more_since_last_warning=2") {
		t.Fatalf("after %v: logged %q, want the stray warning with the two held back", strayLogEvery, got)
	}

	lg.Print("[WARN] memberlist: Was able to connect to n2 over TCP but UDP probes failed, network may be misconfigured")
	lg.Print("[DEBUG] memberlist: Stream connection from=10.0.0.12:7950")
	got = lines()
	if len(got) != 2 || !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[1], "level=DEBUG") {
		t.Fatalf("other lines: logged %q, want them at their own level", got)
	}
}

// Only a peer's or member's rejected gossip counts: this node's own join to
// a peer, an address in VIPD_PEERS or of a member (and a line that names
// nobody); anyone else's is counted as other and changes nothing.
func TestLeaseNodeKeyErrorSenders(t *testing.T) {
	a := startNode(t, "a", [][]byte{keyA})
	a.n.mu.Lock()
	a.n.peerAddrs = literalPeers([]string{"10.0.0.12", "[fd00::12]:7950", "cp-3.example:7950"})
	a.n.addrs["m"] = "10.0.0.20:7950"
	a.n.mu.Unlock()
	for _, tc := range []struct {
		from   string
		ours   bool
		counts bool
	}{
		{"10.0.0.12", false, true}, {"::ffff:10.0.0.12", false, true}, {"fd00::12", false, true}, {"10.0.0.20", false, true},
		{"", false, true}, {"10.0.0.77", true, true},
		{"10.0.0.99", false, false}, {"192.0.2.7", false, false}, {"fd00::99", false, false},
	} {
		var from netip.Addr
		if tc.from != "" {
			from = netip.MustParseAddr(tc.from)
		}
		if got := a.n.keyError(from, tc.ours); got != tc.counts {
			t.Errorf("keyError(%q, ours %v) = %v, want %v", tc.from, tc.ours, got, tc.counts)
		}
	}
	if p, o := testutil.ToFloat64(a.n.mReject.WithLabelValues("peer")), testutil.ToFloat64(a.n.mReject.WithLabelValues("other")); p != 6 || o != 3 {
		t.Fatalf("vipd_cluster_gossip_rejected_total: peer %v other %v, want 6 and 3", p, o)
	}
}

// The kubeadm first node, alone and holding, meets a port scan: UDP
// junk, an empty datagram, a datagram framed like encrypted gossip under
// no key it knows, and a TCP connection sending an HTTP request. It keeps
// the VIP: none of it comes from a peer or a member. (Before, any
// undecryptable packet vetoed a lone node for KeyVeto, a minute.)
func TestLoneNodeKeepsTheVIPThroughAPortScan(t *testing.T) {
	h := newHoldLog()
	a := startReal(t, "a", t.TempDir(), h)
	if got := h.waitHolder(t, 5*time.Second); got != "a" {
		t.Fatalf("holder %s", got)
	}
	framed := make([]byte, 64)
	_, _ = rand.Read(framed)
	framed[0] = 1 // memberlist's encryption version 1: nonce, ciphertext, tag
	u, err := net.Dial("udp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][]byte{[]byte("hello, is anybody there?"), {}, framed} {
		if _, err := u.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	u.Close()
	c, err := net.DialTimeout("tcp", a.addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, _ = c.Read(make([]byte, 512))
	c.Close()

	deadline := time.Now().Add(3 * time.Second)
	for testutil.ToFloat64(a.n.mReject.WithLabelValues("other")) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("rejections counted: other %v, want >= 3", testutil.ToFloat64(a.n.mReject.WithLabelValues("other")))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the loop has seen any veto by now
	if hs := h.holders(); len(hs) != 1 || hs[0] != "a" {
		t.Fatalf("after the scan: holders %v, want [a]", hs)
	}
	if p := testutil.ToFloat64(a.n.mReject.WithLabelValues("peer")); p != 0 {
		t.Fatalf("a scan counted as a peer's rejected gossip: %v", p)
	}
}
