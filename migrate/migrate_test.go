package migrate

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/bgp"
)

func kubeVIP(t *testing.T, in string) Result {
	t.Helper()
	res, err := KubeVIP(strings.NewReader(in))
	if err != nil {
		t.Fatalf("KubeVIP: %v", err)
	}
	return res
}

func hasWarning(res Result, substr string) bool {
	for _, w := range res.Warnings {
		if strings.Contains(w, substr) {
			return true
		}
	}
	return false
}

func TestParseKubeVIPPeers(t *testing.T) {
	tests := []struct {
		in   string
		want []kvPeer
		err  string
	}{
		{in: "10.0.0.1:65000", want: []kvPeer{{Address: "10.0.0.1", AS: 65000}}},
		{in: "10.0.0.1:65000::false,10.0.0.2:65001", want: []kvPeer{{Address: "10.0.0.1", AS: 65000}, {Address: "10.0.0.2", AS: 65001}}},
		{in: "10.0.0.1:65000:pw:true:1179", want: []kvPeer{{Address: "10.0.0.1", AS: 65000, Password: "pw", Multihop: true, Port: 1179}}},
		{in: "[2001:db8::1]:65000", want: []kvPeer{{Address: "2001:db8::1", AS: 65000}}},
		{in: "[2001:db8::1]:65000:::::true;100;200;4", want: []kvPeer{{Address: "2001:db8::1", AS: 65000, BFD: true, BFDRx: 100, BFDTx: 200, BFDMult: 4}}},
		{in: "10.0.0.1:65000:::::false;;;", want: []kvPeer{{Address: "10.0.0.1", AS: 65000, BFDRx: 300, BFDTx: 300, BFDMult: 3}}},
		{in: "10.0.0.1:65000::::mpbgp_nexthop=fixed", want: []kvPeer{{Address: "10.0.0.1", AS: 65000, MPBGP: "mpbgp_nexthop=fixed"}}},
		{in: "unnumbered:eth1:65002", want: []kvPeer{{Unnumbered: "eth1", AS: 65002}}},
		{in: "unnumbered:eth1", want: []kvPeer{{Unnumbered: "eth1"}}},
		{in: " 10.0.0.1:65000 , ", want: []kvPeer{{Address: "10.0.0.1", AS: 65000}}},
		{in: "10.0.0.1", err: "missing :AS"},
		{in: "10.0.0.1:", err: "missing AS"},
		{in: "10.0.0.1:abc", err: `AS "abc"`},
		{in: "10.0.0.1:0", err: `AS "0"`},
		{in: "host.example:65000", err: "not an IP address"},
		{in: "[2001:db8::1:65000", err: "missing ]"},
		{in: "[2001:db8::1]65000", err: "expected : after ]"},
		{in: "10.0.0.1:65000::maybe", err: "multihop"},
		{in: "10.0.0.1:65000:::70000", err: "port"},
		{in: "10.0.0.1:65000:::::true;1;2", err: "BFD options"},
		{in: "10.0.0.1:65000:::::yes;1;2;3", err: "BFD enable"},
		{in: "10.0.0.1:65000:::::true;x;2;3", err: "BFD value"},
		{in: "10.0.0.1:65000:a:b:c:d:e:f", err: "at most 6"},
		{in: "unnumbered::65000", err: "without an interface"},
		{in: "fe80::1%eth0:65000", err: "not an IP address"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseKubeVIPPeers(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				if !strings.Contains(err.Error(), "bgp_peers entry") {
					t.Errorf("error %q does not name the setting", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d peers %+v, want %+v", len(got), got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("peer %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestVipdPeerStringParsesInVipd checks the formatter against the real
// VIPD_BGP_PEERS parser of the bgp package.
func TestVipdPeerStringParsesInVipd(t *testing.T) {
	peers := []vipdPeer{
		{Address: "192.0.2.1", AS: 65000},
		{Address: "2001:db8::1", AS: 4200000000, Port: 1179, Password: "s3cr#t", Multihop: 50, HoldSec: 30, KeepSec: 10},
		{Address: "10.0.0.1", AS: 1, Port: 179, HoldSec: 9},
	}
	for _, p := range peers {
		s := p.String()
		got, err := bgp.ParsePeers(s)
		if err != nil {
			t.Fatalf("bgp.ParsePeers(%q): %v", s, err)
		}
		g := got[0]
		if g.Address.String() != p.Address || g.AS != p.AS || g.Password != p.Password || g.Multihop != p.Multihop {
			t.Errorf("%q parsed as %+v, want %+v", s, g, p)
		}
		if p.Port != 179 && g.Port != p.Port {
			t.Errorf("%q: port %d, want %d", s, g.Port, p.Port)
		}
		if p.HoldSec != 0 && g.Hold != time.Duration(p.HoldSec)*time.Second {
			t.Errorf("%q: hold %v, want %ds", s, g.Hold, p.HoldSec)
		}
	}
}

func TestKubeVIPErrorsNameTheLine(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "  \n\n", "empty"},
		{"binary", "a\x00b", "binary"},
		{"not utf-8", "vip_arp=true\naddress=10.0.0.1\nvip_interface=eth\xc50\n", "line 3: invalid UTF-8 (byte 0xc5)"},
		{"not utf-8 yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: caf\xe9}\n", "line 3: invalid UTF-8 (byte 0xe9)"},
		{"env list bad line", "vip_arp=true\naddress=10.0.0.1\nthis is not an assignment\n", "line 3:"},
		{"env list unterminated quote", "vip_arp=true\naddress=\"10.0.0.1\n", "line 2:"},
		{"yaml syntax", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: a\n   image: b\n", "line 3: invalid YAML"},
		{"yaml not a mapping", "- a\n- b\n", "line 1:"},
		{"yaml without kind", "apiVersion: v1\nmetadata:\n  name: x\n", "line 1: document 1 has no kind"},
		{"wrong type", "apiVersion: v1\nkind: Pod\nspec:\n  containers: 3\n", "line 1: Pod"},
		{"second document", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Pod\nspec: {containers: [{name: x, env: [{name: a}]]}\n  bad: [\n", "document 2"},
		{"no workload", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: kube-vip}\n", `ServiceAccount "kube-vip"`},
		{"no kube-vip container", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: nginx\n    image: nginx\n", "no kube-vip container"},
		{"bad bgp_peers", "bgp_enable=true\naddress=10.0.0.1\nbgp_peers=10.0.0.2:notanas\n", "bgp_peers entry 1"},
		{"bad bgp_as", "bgp_enable=true\naddress=10.0.0.1\nbgp_as=x\nbgp_peers=10.0.0.2:65000\n", "bgp_as"},
		{"flag without value", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: kube-vip\n    args: [manager, --interface]\n", "--interface needs a value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := KubeVIP(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestKubeVIPPicksTheKubeVIPContainer(t *testing.T) {
	in := `apiVersion: apps/v1
kind: Deployment
metadata: {name: kube-vip-cloud-provider, namespace: kube-system}
spec:
  template:
    spec:
      containers:
      - name: kube-vip-cloud-provider
        image: ghcr.io/kube-vip/kube-vip-cloud-provider:v0.0.10
---
apiVersion: v1
kind: Pod
metadata: {name: sidecar}
spec:
  containers:
  - name: kube-vip
    image: ghcr.io/kube-vip/kube-vip:v0.8.0
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-vip-ds, namespace: kube-system}
spec:
  template:
    spec:
      containers:
      - name: vip
        image: registry.local/mirror/kvip:v0.8.0
        env:
        - {name: vip_arp, value: "true"}
        - {name: cp_enable, value: "true"}
        - {name: address, value: 10.9.9.9}
`
	res := kubeVIP(t, in)
	if v, _ := res.Lookup("VIPD_ADDRESS"); v != "10.9.9.9/32" {
		t.Errorf("VIPD_ADDRESS = %q: the container with kube-vip settings was not chosen", v)
	}
	if !hasWarning(res, `the input also holds Pod "sidecar" container "kube-vip"`) {
		t.Errorf("the other kube-vip container is not mentioned: %q", res.Warnings)
	}
	if hasWarning(res, "cloud-provider") {
		t.Errorf("the cloud provider was taken for kube-vip: %q", res.Warnings)
	}
}

func TestNovaEdgeErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"NOVAEDGE_CP_VIP_ADDRESS=10.0.0.1/32\nnonsense\n", "line 2:"},
		{"NOVAEDGE_CP_VIP_MODE=ospf\n", "NOVAEDGE_CP_VIP_MODE"},
		{"NOVAEDGE_CP_VIP_ADDRESS=vip.example\n", "NOVAEDGE_CP_VIP_ADDRESS"},
		{"NOVAEDGE_CP_VIP_HEALTH_INTERVAL=often\n", "NOVAEDGE_CP_VIP_HEALTH_INTERVAL"},
		{"NOVAEDGE_CP_VIP_FAIL_THRESHOLD=0\n", "NOVAEDGE_CP_VIP_FAIL_THRESHOLD"},
		{"NOVAEDGE_CP_VIP_API_PORT=99999\n", "NOVAEDGE_CP_VIP_API_PORT"},
		{"NOVAEDGE_CP_VIP_MODE=bgp\nNOVAEDGE_BGP_PEER_ADDRESS=router\nNOVAEDGE_BGP_PEER_AS=1\n", "NOVAEDGE_BGP_PEER_ADDRESS"},
		{"NOVAEDGE_CP_VIP_MODE=bgp\nNOVAEDGE_BGP_ROUTER_ID=::1\n", "NOVAEDGE_BGP_ROUTER_ID"},
		{"apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: x\n    env: [{name: FOO, value: bar}]\n", "no container with NOVAEDGE_CP_VIP_"},
		{"[Unit]\nDescription=x\n[Service]\nExecStart=/bin/agent \"--cp-vip-address=1.2.3.4/32\n", "line 4: ExecStart: unterminated"},
		{"[Service]\nExecStart=/bin/agent\nthis is no key\n", "line 3: expected Key=value"},
		{"[Unit]\n[Service\nExecStart=/bin/agent\n", "line 2: unterminated section"},
		{"[Service]\nEnvironment=NOVAEDGE_CP_VIP_MODE\n", "line 2: Environment"},
		{"[Service]\nExecStart=/bin/agent --control-plane-vip --cp-vip-address\n", "--cp-vip-address needs a value"},
	}
	for _, tc := range tests {
		_, err := NovaEdge(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NovaEdge(%q): err = %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}

func TestUnitWords(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{`/bin/a --x=1  --y "two words" 'single q' esc\ aped`, []string{"/bin/a", "--x=1", "--y", "two words", "single q", "esc aped"}},
		{`"A=1" B=2`, []string{"A=1", "B=2"}},
		{`--flag=pre"quoted part"post`, []string{"--flag=prequoted partpost"}},
		{``, nil},
	}
	for _, tc := range tests {
		got, err := unitWords(tc.in)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
			t.Errorf("unitWords(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestNovaEdgeUnitNotes(t *testing.T) {
	in := "[Service]\nEnvironmentFile=/etc/novaedge/cpvip.env\nExecStart=-/usr/local/bin/novaedge-agent --control-plane-vip --cp-vip-address 10.0.0.7/32 --log-level=dpanic --metrics-port 9999\n"
	res, err := NovaEdge(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := res.Lookup("VIPD_ADDRESS"); v != "10.0.0.7/32" {
		t.Errorf("VIPD_ADDRESS = %q", v)
	}
	if v, _ := res.Lookup("VIPD_LOG_LEVEL"); v != "error" {
		t.Errorf("VIPD_LOG_LEVEL = %q", v)
	}
	for _, w := range []string{"EnvironmentFile=/etc/novaedge/cpvip.env: migrate that file too", `flag "--metrics-port" has no vipd equivalent`} {
		if !hasWarning(res, w) {
			t.Errorf("no warning %q in %q", w, res.Warnings)
		}
	}
	if hasWarning(res, "9999") {
		t.Errorf("the value of an ignored flag was taken as an argument: %q", res.Warnings)
	}
}

func TestNovaEdgeFromManifest(t *testing.T) {
	in := `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: novaedge-cpvip, namespace: kube-system}
spec:
  template:
    spec:
      hostNetwork: true
      containers:
      - name: agent
        image: ghcr.io/azrtydxb/novaedge-agent:v0.4.0
        env:
        - {name: NOVAEDGE_CP_VIP_ADDRESS, value: 10.1.0.100/32}
        - {name: NOVAEDGE_CP_VIP_MODE, value: l2}
`
	res, err := NovaEdge(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := res.Lookup("VIPD_ADDRESS"); v != "10.1.0.100/32" {
		t.Errorf("VIPD_ADDRESS = %q", v)
	}
}

func TestKubeVIPMapping(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		want     map[string]string // enabled assignments; "" value means must be absent
		warnings []string
	}{
		{
			name: "flags then env: env wins",
			in: `apiVersion: v1
kind: Pod
spec:
  containers:
  - name: kube-vip
    args: [manager, --interface=eth1, --address, 10.0.0.5, --arp, --controlplane, --port=8443]
    env:
    - {name: vip_interface, value: eth2}
`,
			want: map[string]string{"VIPD_INTERFACE": "eth2", "VIPD_ADDRESS": "10.0.0.5/32", "VIPD_MODE": "l2", "VIPD_HEALTH_URL": "https://127.0.0.1:8443/livez"},
		},
		{
			name: "dual stack with per-family subnets",
			in:   "vip_arp=true\ncp_enable=true\naddress=10.0.0.5,fd00::5\nvip_subnet=32,128\n",
			want: map[string]string{"VIPD_ADDRESS": "10.0.0.5/32,fd00::5/128"},
		},
		{
			name:     "non-host subnet is narrowed with a warning",
			in:       "vip_arp=true\ncp_enable=true\nvip_address=10.0.0.5\nvip_subnet=24\n",
			want:     map[string]string{"VIPD_ADDRESS": "10.0.0.5/32"},
			warnings: []string{"prefix /24"},
		},
		{
			name:     "DNS name address is unsupported and leaves VIPD_ADDRESS commented",
			in:       "vip_arp=true\ncp_enable=true\naddress=api.example.com\n",
			want:     map[string]string{"VIPD_ADDRESS": ""},
			warnings: []string{`address "api.example.com" is not an IP address`},
		},
		{
			name:     "routing table mode is unsupported and not enabled",
			in:       "vip_routingtable=true\ncp_enable=true\naddress=10.0.0.5\nvip_routingtableid=198\n",
			want:     map[string]string{"VIPD_ADDRESS": "", "VIPD_MODE": ""},
			warnings: []string{"unsupported: routing-table mode"},
		},
		{
			name:     "wireguard is unsupported",
			in:       "vip_wireguard=true\ncp_enable=true\naddress=10.0.0.5\n",
			want:     map[string]string{"VIPD_ADDRESS": ""},
			warnings: []string{"unsupported: WireGuard"},
		},
		{
			name:     "egress and lb are listed",
			in:       "vip_arp=true\ncp_enable=true\naddress=10.0.0.5\nlb_enable=true\nlb_port=6443\nsvc_enable=true\negress_podcidr=10.244.0.0/16\n",
			warnings: []string{"unsupported: IPVS load balancing", "unsupported: Services of type LoadBalancer"},
		},
		{
			name:     "services only",
			in:       "vip_arp=true\nsvc_enable=true\n",
			want:     map[string]string{"VIPD_ADDRESS": ""},
			warnings: []string{"served only Services", "no address or vip_address"},
		},
		{
			name:     "invalid boolean",
			in:       "vip_arp=yes\ncp_enable=true\naddress=10.0.0.5\n",
			want:     map[string]string{"VIPD_MODE": "l2"},
			warnings: []string{`vip_arp="yes" is not a boolean`, "assuming l2"},
		},
		{
			name: "bgp legacy single peer with defaults",
			in:   "bgp_enable=true\ncp_enable=true\naddress=10.0.0.5\nbgp_routerid=10.0.0.11\nbgp_peeraddress=10.0.0.1\nbgp_peerpass=pw\nbgp_multihop=true\n",
			want: map[string]string{"VIPD_MODE": "bgp", "VIPD_BGP_LOCAL_AS": "65000", "VIPD_BGP_ROUTER_ID": "10.0.0.11",
				"VIPD_BGP_PEERS": "10.0.0.1:65000:multihop=50:password=pw"},
		},
		{
			name:     "bgp peers and legacy peer are both kept, leader election warned",
			in:       "bgp_enable=true\ncp_enable=true\naddress=10.0.0.5\nbgp_as=65010\nbgp_peers=10.0.0.1:65000,[fd00::1]:65000\nbgp_peeraddress=fd00::2\nbgp_peeras=65020\nvip_leaderelection=true\n",
			want:     map[string]string{"VIPD_BGP_PEERS": "10.0.0.1:65000,[fd00::1]:65000,[fd00::2]:65020", "VIPD_BGP_LOCAL_AS": "65010"},
			warnings: []string{"advertise from one elected node"},
		},
		{
			name:     "bgp without peers",
			in:       "bgp_enable=true\ncp_enable=true\naddress=10.0.0.5\n",
			want:     map[string]string{"VIPD_BGP_PEERS": ""},
			warnings: []string{"no usable BGP peer"},
		},
		{
			name:     "password with a colon cannot be expressed",
			in:       "bgp_enable=true\ncp_enable=true\naddress=10.0.0.5\nbgp_peeraddress=10.0.0.1\nbgp_peerpass=a:b\n",
			warnings: []string{"contains ':' or ','"},
		},
		{
			name: "router id and password from the pod",
			in: `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-vip-ds, namespace: kube-system}
spec:
  template:
    spec:
      containers:
      - name: kube-vip
        image: ghcr.io/kube-vip/kube-vip:v0.9.2
        args: [manager]
        env:
        - {name: bgp_enable, value: "true"}
        - {name: cp_enable, value: "true"}
        - {name: address, value: 10.0.0.5}
        - {name: bgp_peeraddress, value: 10.0.0.1}
        - name: bgp_routerid
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        - name: bgp_peerpass
          valueFrom: {secretKeyRef: {name: bgp-auth, key: password}}
`,
			want:     map[string]string{"VIPD_BGP_ROUTER_ID": "", "VIPD_BGP_PEERS": "10.0.0.1:65000"},
			warnings: []string{"bgp_routerid came from the Pod field status.podIP", `bgp_peerpass comes from Secret "bgp-auth" key "password"`},
		},
		{
			name:     "bgp settings without bgp",
			in:       "vip_arp=true\ncp_enable=true\naddress=10.0.0.5\nbgp_routerid=1.2.3.4\n",
			want:     map[string]string{"VIPD_BGP_ROUTER_ID": ""},
			warnings: []string{"bgp_routerid=1.2.3.4 is a BGP setting but BGP is not enabled"},
		},
		{
			name:     "literal node name kept, unknown variable warned",
			in:       "vip_arp=true\ncp_enable=true\naddress=10.0.0.5\nvip_nodename=cp-2\nVIP_ARP=true\n",
			want:     map[string]string{"VIPD_NODE_NAME": "cp-2"},
			warnings: []string{"VIP_ARP is not a kube-vip setting"},
		},
		{
			name: "log level by image version",
			in:   "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: kube-vip\n    image: ghcr.io/kube-vip/kube-vip:v0.8.0@sha256:abc\n    env:\n    - {name: vip_arp, value: \"true\"}\n    - {name: cp_enable, value: \"true\"}\n    - {name: address, value: 10.0.0.5}\n    - {name: vip_loglevel, value: \"4\"}\n",
			want: map[string]string{"VIPD_LOG_LEVEL": "info"},
		},
		{
			name: "log level 8 is error in slog",
			in:   "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: kube-vip\n    image: ghcr.io/kube-vip/kube-vip:v1.0.0\n    env:\n    - {name: vip_arp, value: \"true\"}\n    - {name: cp_enable, value: \"true\"}\n    - {name: address, value: 10.0.0.5}\n    - {name: vip_loglevel, value: \"8\"}\n",
			want: map[string]string{"VIPD_LOG_LEVEL": "error"},
		},
		{
			name:     "dead and changed settings",
			in:       "vip_arp=true\ncp_enable=true\naddress=10.0.0.5\ndebounce_time=3s\nvip_loseleadership=true\nconfig_file=/etc/kube-vip/config.yaml\n",
			warnings: []string{"debounce_time=3s did nothing", "vip_loseleadership=true has no vipd equivalent", "config_file=/etc/kube-vip/config.yaml has no vipd equivalent"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := kubeVIP(t, tc.in)
			for name, want := range tc.want {
				got, ok := res.Lookup(name)
				if want == "" {
					if ok {
						t.Errorf("%s=%q is set, want it absent or commented out", name, got)
					}
					continue
				}
				if got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
			for _, w := range tc.warnings {
				if !hasWarning(res, w) {
					t.Errorf("no warning containing %q in %q", w, res.Warnings)
				}
			}
		})
	}
}

func TestQuoteEnvValueRoundTrip(t *testing.T) {
	for _, v := range []string{"", "plain", "a b", `q"uote`, "dollar$HOME", "back\\slash", "hash#tag", "tick`", "x'y", "multi\nline", "[fd00::1]:65000:password=p"} {
		var buf bytes.Buffer
		r := Result{Env: []EnvLine{{Name: "VIPD_X", Value: v}}}
		if err := r.WriteEnv(&buf); err != nil {
			t.Fatal(err)
		}
		src, err := parseEnvList(buf.Bytes())
		if err != nil {
			t.Fatalf("%q: written as %q does not parse: %v", v, buf.String(), err)
		}
		got, _ := src.lookup("VIPD_X")
		if got.Value != v {
			t.Errorf("%q written as %q reads back as %q", v, buf.String(), got.Value)
		}
	}
}

func TestWriteEnvLayout(t *testing.T) {
	r := Result{Env: []EnvLine{
		{Comment: "header\n\nsecond paragraph"},
		{Name: "A", Value: "1", Comment: "about A"},
		{Name: "B", Value: "2"},
		{Name: "C", Value: "", Disabled: true, Comment: "fill in"},
	}}
	var buf bytes.Buffer
	if err := r.WriteEnv(&buf); err != nil {
		t.Fatal(err)
	}
	want := "# header\n#\n# second paragraph\n\n# about A\nA=1\nB=2\n\n# fill in\n#C=\n"
	if buf.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", buf.String(), want)
	}
	if _, ok := r.Lookup("C"); ok {
		t.Error("Lookup returns a disabled line")
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

func TestWriteErrorsAreReturned(t *testing.T) {
	r := Result{Env: []EnvLine{{Name: "A", Value: "1"}}, Warnings: []string{"w"}}
	if err := r.WriteEnv(failingWriter{}); err == nil {
		t.Error("WriteEnv ignored a write error")
	}
	if err := r.WriteWarnings(failingWriter{}); err == nil {
		t.Error("WriteWarnings ignored a write error")
	}
}

func TestImageVersion(t *testing.T) {
	tests := []struct {
		image        string
		major, minor int
		ok           bool
	}{
		{"ghcr.io/kube-vip/kube-vip:v0.8.9", 0, 8, true},
		{"ghcr.io/kube-vip/kube-vip:v1.2.3-rc1", 1, 2, true},
		{"plndr/kube-vip:0.3.1", 0, 3, true},
		{"localhost:5000/kube-vip", 0, 0, false},
		{"ghcr.io/kube-vip/kube-vip@sha256:abcd", 0, 0, false},
		{"ghcr.io/kube-vip/kube-vip:latest", 0, 0, false},
		{"", 0, 0, false},
	}
	for _, tc := range tests {
		ma, mi, ok := imageVersion(tc.image)
		if ma != tc.major || mi != tc.minor || ok != tc.ok {
			t.Errorf("imageVersion(%q) = %d, %d, %v; want %d, %d, %v", tc.image, ma, mi, ok, tc.major, tc.minor, tc.ok)
		}
	}
}
