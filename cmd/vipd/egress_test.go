package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/egress"
	"github.com/vipd/vipd/internal/wire"
	"github.com/vipd/vipd/pools"
)

// TestCheckConfigEgress: VIPD_EGRESS errors are one line naming the
// setting and the form; a cluster has no limit on the number of VIPs and
// egress IPs (the lease election does not carry them in the metadata).
func TestCheckConfigEgress(t *testing.T) {
	var vips []string
	for i := 1; i <= 24; i++ {
		vips = append(vips, fmt.Sprintf("192.168.100.%d/32", 100+i))
	}
	for _, tc := range []struct {
		name   string
		env    []string
		code   int
		stdout string
		stderr string
	}{
		{"valid", []string{"VIPD_ADDRESS=", "VIPD_EGRESS=10.0.0.200 from 10.244.0.0/16 to 0.0.0.0/0"}, 0,
			"VIPD_EGRESS=10.0.0.200 from 10.244.0.0/16 to 0.0.0.0/0\n", ""},
		{"bad rule", []string{"VIPD_ADDRESS=10.0.0.9/32", "VIPD_EGRESS=10.0.0.200 via 10.244.0.0/16"}, exitConfig, "",
			`invalid VIPD_EGRESS="10.0.0.200 via 10.244.0.0/16": want rules "EGRESS_IP from CIDR[,CIDR...] to CIDR[,CIDR...]"`},
		{"no VIP limit in a cluster", []string{"VIPD_ADDRESS=" + strings.Join(vips, ","), "VIPD_PEERS=10.0.0.50", "VIPD_GOSSIP_INSECURE=true",
			"VIPD_EGRESS=192.168.100.200 from 10.244.0.0/16 to 0.0.0.0/0"}, 0, "VIPD_EGRESS=192.168.100.200 from 10.244.0.0/16 to 0.0.0.0/0\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("VIPD_NODE_NAME", "n")
			t.Setenv("VIPD_PEERS", "")
			t.Setenv("VIPD_GOSSIP_INSECURE", "false")
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			code, out, errs := run(t, nil, "check-config")
			if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errs, tc.stderr) {
				t.Fatalf("exit %d (want %d)\nstdout %q (want %q)\nstderr %q (want %q)", code, tc.code, out, tc.stdout, errs, tc.stderr)
			}
			if tc.code != 0 && strings.Count(strings.TrimSpace(errs), "\n") > 0 {
				t.Fatalf("error is not one line: %q", errs)
			}
			if tc.name == "17 VIP limit counts the egress IPs" && !strings.Contains(errs, "counting the 1 egress IP(s) of VIPD_EGRESS") {
				t.Fatalf("the limit error does not mention VIPD_EGRESS: %q", errs)
			}
		})
	}
}

// TestEgressFeedParse: the feed's lines become rules for the egress IPs
// this node elects or holds at run time (the line's addresses); anything
// else is skipped with a reason, a hostile or unreadable line is refused
// (the last rules stay), and a line replaces the whole set.
func TestEgressFeedParse(t *testing.T) {
	var got [][]egress.Rule
	var gotAddrs [][]pools.Address
	var logs strings.Builder
	f := &egressFeed{log: slog.New(slog.NewTextHandler(&logs, nil)), set: func(r []egress.Rule) { got = append(got, r) },
		addrs:   func(a []pools.Address) { gotAddrs = append(gotAddrs, a) },
		elected: map[netip.Addr]bool{netip.MustParseAddr("10.0.0.200"): true, netip.MustParseAddr("fd00::200"): true}}
	feed := strings.Join([]string{
		`{"rules":[{"policy":"a/x","egressIP":"10.0.0.200","from":["10.244.1.5/32","10.244.2.9/32"],"to":["0.0.0.0/0"]},` +
			`{"policy":"a/y","egressIP":"10.0.0.99","from":["10.244.1.5/32"],"to":["0.0.0.0/0"]},` +
			`{"policy":"a/z","egressIP":"fd00::200","from":["10.244.1.5/32"],"to":["::/0"]},` +
			`{"policy":"a/v6","egressIP":"fd00::200","from":["fd00:10:244::5/128"],"to":["::/0"]}]}`,
		`not json`,
		`{"rules":[{"policy":"b/rt","egressIP":"10.0.0.201","from":["10.244.1.7/32"],"to":["0.0.0.0/0"]}],` +
			`"addresses":[{"policy":"b/rt","egressIP":"10.0.0.201","nodes":["n1","n2",""]},` +
			`{"policy":"b/dup","egressIP":"10.0.0.201","nodes":["n3"]},` +
			`{"policy":"b/mc","egressIP":"224.0.0.5","nodes":["n3"]},` +
			`{"policy":"b/zone","egressIP":"fe80::1%eth0","nodes":["n3"]},` +
			`{"policy":"b/elected","egressIP":"10.0.0.200","nodes":["n3"]}]}`,
		`{"rules":{"policy":"wrong shape"}}`,
		`{"rules":[]}`,
	}, "\n") + "\n"
	bad := 0
	for _, l := range strings.Split(strings.TrimSpace(feed), "\n") {
		if err := f.line([]byte(l)); err != nil {
			bad++ // internal/child counts, logs and skips it
		}
	}
	if bad != 2 {
		t.Fatalf("%d lines refused, want the 2 unreadable ones", bad)
	}
	if len(got) != 3 || len(gotAddrs) != 3 {
		t.Fatalf("rule sets: %v, address sets %v", got, gotAddrs)
	}
	if len(got[0]) != 2 || got[0][0].IP != netip.MustParseAddr("10.0.0.200") || len(got[0][0].From) != 2 || got[0][1].IP != netip.MustParseAddr("fd00::200") {
		t.Fatalf("first set: %+v", got[0])
	}
	if len(gotAddrs[0]) != 0 {
		t.Fatalf("first addresses: %+v", gotAddrs[0])
	}
	// The runtime address: its rule is accepted, its empty node name
	// dropped; the duplicate, multicast, zoned and elected entries are not
	// runtime addresses.
	if len(got[1]) != 1 || got[1][0].IP != netip.MustParseAddr("10.0.0.201") {
		t.Fatalf("second set: %+v", got[1])
	}
	if a := gotAddrs[1]; len(a) != 1 || a[0].Addr != netip.MustParseAddr("10.0.0.201") || a[0].Mode != pools.ModeL2 ||
		!slices.Equal(a[0].Nodes, []string{"n1", "n2"}) || a[0].Service != "b/rt" {
		t.Fatalf("second addresses: %+v", a)
	}
	if len(got[2]) != 0 || len(gotAddrs[2]) != 0 {
		t.Fatalf("an empty line must clear the rules and addresses: %+v %+v", got[2], gotAddrs[2])
	}
	for _, want := range []string{"listed twice", "224.0.0.5", "fe80::1%eth0"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no log line about %q:\n%s", want, logs.String())
		}
	}
}

// TestEgressFeedWire: what vipd-controllers egressfeed encodes (the wire
// types it marshals) is what vipd decodes.
func TestEgressFeedWire(t *testing.T) {
	var got []egress.Rule
	var gotAddrs []pools.Address
	f := &egressFeed{log: slog.New(slog.NewTextHandler(io.Discard, nil)), set: func(r []egress.Rule) { got = r },
		addrs:   func(a []pools.Address) { gotAddrs = a },
		elected: map[netip.Addr]bool{netip.MustParseAddr("10.0.0.200"): true}}
	b, err := json.Marshal(wire.EgressDoc{
		Rules: []wire.EgressRule{{Policy: "a/x", EgressIP: "10.0.0.200", From: []string{"10.244.1.5/32"}, To: []string{"0.0.0.0/0"}},
			{Policy: "a/rt", EgressIP: "10.0.0.201", From: []string{"10.244.1.6/32"}, To: []string{"192.0.2.0/24"}}},
		Addresses: []wire.EgressAddress{{Policy: "a/rt", EgressIP: "10.0.0.201", Nodes: []string{"n1"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.line(b); err != nil {
		t.Fatal(err)
	}
	want := []egress.Rule{
		{IP: netip.MustParseAddr("10.0.0.200"), From: []netip.Prefix{netip.MustParsePrefix("10.244.1.5/32")}, To: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
		{IP: netip.MustParseAddr("10.0.0.201"), From: []netip.Prefix{netip.MustParsePrefix("10.244.1.6/32")}, To: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("rules %v, want %v", got, want)
	}
	if len(gotAddrs) != 1 || gotAddrs[0].Addr != netip.MustParseAddr("10.0.0.201") || gotAddrs[0].Service != "a/rt" || !slices.Equal(gotAddrs[0].Nodes, []string{"n1"}) {
		t.Fatalf("addresses %+v", gotAddrs)
	}
}

// holders is a holderLookup: VIP to holder name and address.
type holders map[string]string

func (h holders) Holder(vip string) (string, netip.Addr) {
	name := h[vip]
	if name == "" {
		return "", netip.Addr{}
	}
	return name, netip.MustParseAddr("10.0.0.9")
}

// TestGateways: the election's holder for the elected egress IPs (this
// node when it holds), and this node when nobody is elected.
func TestGateways(t *testing.T) {
	ip := netip.MustParseAddr("192.0.2.10")
	for _, tc := range []struct {
		name string
		gw   gateways
		want egress.Gateway
	}{
		{"held here", gateways{self: "n1", elected: holders{"192.0.2.10/32": "n1"}}, egress.Gateway{Self: true, Node: "n1", Addr: netip.MustParseAddr("10.0.0.9")}},
		{"held elsewhere", gateways{self: "n1", elected: holders{"192.0.2.10/32": "n2"}}, egress.Gateway{Node: "n2", Addr: netip.MustParseAddr("10.0.0.9")}},
		{"no holder", gateways{self: "n1", elected: holders{}}, egress.Gateway{}},
		{"no election", gateways{self: "n1"}, egress.Gateway{Node: "n1"}},
	} {
		if got := tc.gw.Gateway(ip); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
