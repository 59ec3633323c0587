package lab

import (
	"context"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
)

func TestParseNextHops(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"10.1.2.3 via 10.0.0.2 dev eth0 proto bgp metric 20\n", []string{"10.0.0.2"}},
		{"198.51.100.10 nhid 22 proto bgp metric 20\n\tnexthop via 10.0.0.2 dev eth0 weight 1\n\tnexthop via 10.0.0.1 dev eth0 weight 1\n",
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"2001:db8::10 nhid 17 proto bgp metric 20 pref medium\n\tnexthop via fd00::1 dev eth0 weight 1\n\tnexthop via fd00::2 dev eth0 weight 1\n",
			[]string{"fd00::1", "fd00::2"}},
	}
	for _, tt := range tests {
		var got []string
		for _, a := range parseNextHops(tt.in) {
			got = append(got, a.String())
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseNextHops(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestBGPRouterRender(t *testing.T) {
	conf, err := BGPRouter{AS: 65000, RouterID: netip.MustParseAddr("192.0.2.1"),
		Ranges:   []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/64")},
		Password: "s3cret", BFD: &BFDProfile{ReceiveInterval: 100, TransmitInterval: 100, DetectMultiplier: 3}}.Render()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"router bgp 65000", "bgp listen range 192.0.2.0/24 peer-group NODES0", "bgp listen range 2001:db8::/64 peer-group NODES1",
		"neighbor NODES0 password s3cret", "neighbor NODES1 bfd profile vipd", "address-family ipv6 unicast\n  neighbor NODES1 activate\n  maximum-paths 16",
		"receive-interval 100", "neighbor NODES0 timers 3 9",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %q:\n%s", want, conf)
		}
	}
	if _, err := (BGPRouter{AS: 65000}).Render(); err == nil {
		t.Error("incomplete router rendered without error")
	}
}

func TestFRRStartRestartCleanup(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "vtysh")
	if _, err := os.Stat(FRRDir + "/bgpd"); err != nil {
		testenv.Missing(t, "FRR daemons in %s", FRRDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := Create(Options{Nodes: 1, Extra: []string{"r"}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := l.Extra["r"]
	conf, err := BGPRouter{AS: 65000, RouterID: r.IPv4, Ranges: []netip.Prefix{l.Prefix4, l.Prefix6},
		BFD: &BFDProfile{ReceiveInterval: 300, TransmitInterval: 300, DetectMultiplier: 3}}.Render()
	if err != nil {
		t.Fatal(err)
	}
	f, err := r.StartFRR(ctx, conf)
	if err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		out, err := f.Vtysh(ctx, "show running-config")
		if err != nil {
			t.Fatalf("%v\n%s", err, f.Logs())
		}
		if !strings.Contains(string(out), "bgp listen range "+l.Prefix4.String()) || !strings.Contains(string(out), "profile vipd") {
			t.Fatalf("configuration not applied:\n%s", out)
		}
		// The daemons run in the router's namespace, not the host's.
		self, _ := os.Readlink("/proc/self/ns/net")
		for _, p := range f.procs {
			ns, err := os.Readlink("/proc/" + strconv.Itoa(p.Pid()) + "/ns/net")
			if err != nil || ns == self {
				t.Fatalf("%s runs in the host namespace (%s, %v)", p.Name, ns, err)
			}
		}
		if peers, err := f.BFDPeers(ctx); err != nil || len(peers) != 0 {
			t.Fatalf("BFDPeers = %v, %v; want none yet", peers, err)
		}
		if hops, err := f.BGPNextHops(ctx, netip.MustParsePrefix("198.51.100.1/32")); err != nil || len(hops) != 0 {
			t.Fatalf("BGPNextHops = %v, %v; want none", hops, err)
		}
	}
	check()
	if err := f.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	check()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range f.procs {
		if !p.Exited() {
			t.Errorf("%s survived lab close", p.Name)
		}
	}
	if _, err := os.Stat(f.runDir()); !os.IsNotExist(err) {
		t.Errorf("%s left behind (%v)", f.runDir(), err)
	}
}
