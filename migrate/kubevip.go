package migrate

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	kubev1 "github.com/vipd/vipd/migrate/internal/kube/v1"
)

// KubeVIP translates a kube-vip configuration into a vipd env file. The
// input is a static-pod manifest, a DaemonSet (or Deployment) manifest,
// possibly in a multi-document stream with RBAC objects, or a plain list of
// NAME=VALUE lines. Invalid input is an error naming the line.
func KubeVIP(r io.Reader) (Result, error) {
	data, err := readAll(r)
	if err != nil {
		return Result{}, err
	}
	src, err := kubeVIPSource(data)
	if err != nil {
		return Result{}, err
	}
	return translateKubeVIP(src)
}

// kubeVIPEnvHints are names whose presence marks a kube-vip container.
var kubeVIPEnvHints = []string{"address", "vip_address", "vip_arp", "bgp_enable", "cp_enable", "svc_enable"}

func kubeVIPSource(data []byte) (*source, error) {
	if looksLikeEnvList(data) {
		return parseEnvList(data)
	}
	workloads, skipped, err := parseManifests(data)
	if err != nil {
		return nil, err
	}
	// Prefer containers that carry kube-vip settings; a container that is
	// only named kube-vip comes next (settings in args). The cloud provider
	// (kube-vip-cloud-provider) is not kube-vip.
	var found []*source
	var scores []int
	best := 0
	for _, w := range workloads {
		for _, c := range w.spec.Containers {
			if sc := kubeVIPScore(c); sc > 0 {
				found = append(found, containerSource(w, c))
				scores = append(scores, sc)
				best = max(best, sc)
			}
		}
	}
	if len(found) == 0 {
		what := "no Pod, DaemonSet or Deployment"
		if len(workloads) > 0 {
			what = "no kube-vip container (image kube-vip or env address/vip_arp/bgp_enable)"
		}
		if len(skipped) > 0 {
			return nil, fmt.Errorf("%s found in the input (it holds %s)", what, strings.Join(skipped, ", "))
		}
		return nil, fmt.Errorf("%s found in the input", what)
	}
	var src *source
	for i, f := range found {
		if src == nil && scores[i] == best {
			src = f
		}
	}
	for _, other := range found {
		if other != src {
			src.Notes = append(src.Notes, fmt.Sprintf("the input also holds %s; only %s was migrated", other.Describe, src.Describe))
		}
	}
	if err := applyKubeVIPArgs(src); err != nil {
		return nil, err
	}
	return src, nil
}

// kubeVIPScore rates how surely c is kube-vip: 2 with kube-vip settings in
// its env, 1 when only its image or name says so, 0 otherwise.
func kubeVIPScore(c kubev1.Container) int {
	if strings.Contains(c.Image, "kube-vip-cloud-provider") || strings.Contains(c.Name, "cloud-provider") {
		return 0
	}
	for _, e := range c.Env {
		if slices.Contains(kubeVIPEnvHints, e.Name) {
			return 2
		}
	}
	if strings.Contains(c.Image, "kube-vip") || strings.Contains(c.Name, "kube-vip") {
		return 1
	}
	return 0
}

// applyKubeVIPArgs turns the container's kube-vip flags into variables
// placed before the env ones: kube-vip lets env vars override flags.
func applyKubeVIPArgs(src *source) error {
	var flagVars []variable
	args := src.Args
	sub := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			if sub == "" {
				sub = a
				continue
			}
			src.Notes = append(src.Notes, fmt.Sprintf("argument %q was ignored", a))
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f, ok := kubeVIPFlags[name]
		if !ok {
			src.Notes = append(src.Notes, fmt.Sprintf("flag %q is not a kube-vip flag vipd knows; ignored", a))
			continue
		}
		if !hasValue {
			if f.isBool {
				value = "true"
			} else {
				if i+1 >= len(args) {
					return fmt.Errorf("%s: flag %s needs a value", src.Describe, a)
				}
				i++
				value = args[i]
			}
		}
		flagVars = append(flagVars, variable{Name: f.env, Value: value})
	}
	if sub != "" && sub != "manager" {
		src.Notes = append(src.Notes, fmt.Sprintf("kube-vip ran the %q subcommand, not \"manager\"", sub))
	}
	src.Vars = append(flagVars, src.Vars...)
	return nil
}

// kv is the translation's view of the source: effective values by name and
// which names it has consumed.
type kv struct {
	src  *source
	used map[string]bool
	b    *builder
}

// get returns the effective (last) value of name and marks it consumed.
func (k *kv) get(name string) (string, bool) {
	k.used[name] = true
	v, ok := k.src.lookup(name)
	if !ok {
		return "", false
	}
	if v.External != "" {
		k.b.warn("%s comes from %s, which the migration cannot read: set its vipd equivalent by hand", name, v.External)
		return "", false
	}
	if v.FieldPath != "" {
		return "", true
	}
	return strings.TrimSpace(v.Value), true
}

// boolean returns the value of a kube-vip boolean; an invalid value is a
// warning and counts as false (kube-vip itself refused to start).
func (k *kv) boolean(name string) bool {
	v, ok := k.get(name)
	if !ok || v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		k.b.warn("%s=%q is not a boolean (kube-vip would not start); treated as false", name, v)
		return false
	}
	return b
}

func (k *kv) field(name string) string {
	v, _ := k.src.lookup(name)
	return v.FieldPath
}

func translateKubeVIP(src *source) (Result, error) {
	b := &builder{}
	k := &kv{src: src, used: map[string]bool{}, b: b}
	head := "vipd environment file generated by `vipd migrate kube-vip` from the " + src.Describe
	if src.Image != "" {
		head += "\n(image " + src.Image + ")"
	}
	head += ".\nReview every line, then install it as /etc/vipd/vipd.env on each node and run `vipd check-config`."
	b.comment(head)
	for _, n := range src.Notes {
		b.warn("%s", n)
	}

	// Mode.
	arp, bgp := k.boolean("vip_arp"), k.boolean("bgp_enable")
	rt, wg := k.boolean("vip_routingtable"), k.boolean("vip_wireguard")
	cp := k.boolean("cp_enable")
	svc := k.boolean("svc_enable")
	k.used["svc_enable"] = false // reported with the other settings below
	mode, safe := "", true
	switch {
	case bgp && arp:
		b.warn("both vip_arp and bgp_enable are true (kube-vip accepts only one mode); using bgp")
		mode = "bgp"
	case bgp:
		mode = "bgp"
	case arp:
		mode = "l2"
	case rt:
		b.warn("unsupported: %s: an external routing daemon announced kube-vip's routes; use VIPD_MODE=bgp so vipd announces the VIP itself. VIPD_ADDRESS is left commented out until you choose", featRT)
		safe = false
	case wg:
		b.warn("unsupported: %s. VIPD_ADDRESS is left commented out until you choose a mode", featWireGuard)
		safe = false
	default:
		b.warn("neither vip_arp nor bgp_enable is true; assuming l2 (ARP/NDP) mode")
		mode = "l2"
	}
	if !cp {
		if svc {
			b.warn("cp_enable is not true: this kube-vip served only Services, which vipd does not do (%s)", servicesAdvice)
		} else {
			b.warn("cp_enable is not true: kube-vip did not manage a control-plane VIP with this configuration")
		}
	}

	// Addresses.
	addrs, ok := k.addresses()
	switch {
	case !ok:
		b.suggest("VIPD_ADDRESS", "", "The VIP(s) in CIDR form, e.g. 192.0.2.10/32,2001:db8::10/128 (required).")
	case !safe:
		b.suggest("VIPD_ADDRESS", addrs, "from address: enable once the mode is chosen.")
	default:
		b.set("VIPD_ADDRESS", addrs, "from "+k.addressSource()+".")
	}
	switch mode {
	case "bgp":
		b.set("VIPD_MODE", "bgp", "from bgp_enable=true: every healthy node advertises the VIP (ECMP at the router).")
	case "l2":
		b.set("VIPD_MODE", "l2", "from vip_arp=true: one node holds the VIP and announces it with ARP/NDP.")
	}

	// Interface.
	if iface, ok := k.get("vip_interface"); ok && iface != "" {
		if mode == "l2" {
			b.set("VIPD_INTERFACE", iface, "from vip_interface.")
		} else {
			b.comment(fmt.Sprintf("vip_interface=%s: in bgp mode vipd binds the VIP on lo itself.", iface))
		}
	} else if mode == "l2" {
		b.comment("vip_interface was not set: like kube-vip, vipd uses the interface of the default route (VIPD_INTERFACE).")
	}

	// Node name.
	k.nodeName()

	// Health.
	k.health(mode)

	// Election and announcements.
	k.election(mode)

	// BGP.
	if mode == "bgp" {
		if err := k.bgp(); err != nil {
			return Result{}, err
		}
	} else {
		k.ignoreBGP()
	}

	// Metrics and logs.
	k.metrics()
	k.logLevel()

	// Kubeconfig mounts.
	for _, p := range src.HostPaths {
		switch {
		case strings.HasSuffix(p, "super-admin.conf"):
			b.warn("the kube-vip Pod mounts %s (the kubeadm >= 1.29 first-node workaround, kube-vip#684): vipd needs no kubeconfig, so nothing replaces it; remove the mount together with kube-vip", p)
		case strings.HasSuffix(p, "admin.conf"):
			b.comment(fmt.Sprintf("kube-vip mounted %s to reach its Lease; vipd needs no kubeconfig for the VIP.", p))
		}
	}

	k.rest(svc)
	return b.res, nil
}

// addresses returns VIPD_ADDRESS built from address/vip_address and
// vip_subnet/vip_cidr.
func (k *kv) addresses() (string, bool) {
	raw, ok := k.get("address")
	legacy, lok := k.get("vip_address")
	if (!ok || raw == "") && lok && legacy != "" {
		raw = legacy
	} else if ok && raw != "" && lok && legacy != "" && legacy != raw {
		k.b.warn("both address=%s and vip_address=%s are set; kube-vip uses address", raw, legacy)
	}
	subnet, sok := k.get("vip_subnet")
	if cidr, cok := k.get("vip_cidr"); cok && cidr != "" {
		if !sok || subnet == "" {
			k.b.warn("vip_cidr=%s was replaced by vip_subnet in kube-vip v0.9.0 (and is ignored there); vipd binds VIPs as /32 and /128", cidr)
			subnet = cidr
		}
	}
	if raw == "" {
		k.b.warn("no address or vip_address: set VIPD_ADDRESS by hand")
		return "", false
	}
	var subnets []string
	if subnet != "" {
		subnets = strings.Split(subnet, ",")
	}
	var out []string
	for i, a := range strings.Split(raw, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		var ip netip.Addr
		bits := -1
		if p, err := netip.ParsePrefix(a); err == nil {
			ip, bits = p.Addr(), p.Bits()
		} else if addr, err := netip.ParseAddr(a); err == nil {
			ip = addr
		} else {
			k.b.warn("unsupported: address %q is not an IP address (kube-vip resolved DNS names); vipd needs the VIP itself in VIPD_ADDRESS", a)
			return "", false
		}
		if ip.Zone() != "" {
			k.b.warn("address %q has a zone; vipd needs global VIPs", a)
			return "", false
		}
		ip = ip.Unmap()
		host := 32
		if ip.Is6() {
			host = 128
		}
		if bits < 0 && len(subnets) > 0 {
			s := strings.TrimSpace(subnets[min(i, len(subnets)-1)])
			if s != "" && s != "auto" {
				n, err := strconv.Atoi(s)
				switch {
				case err != nil || n < 0 || n > 128:
					k.b.warn("vip_subnet %q is not a prefix length; using /%d", s, host)
				case len(subnets) == 1 && ip.Is6() && n <= 32:
					// One value for a dual-stack list is meant for IPv4.
				default:
					bits = n
				}
			}
		}
		if bits >= 0 && bits != host && !(ip.Is4() && bits > 32) {
			k.b.warn("kube-vip added %s with prefix /%d (a connected route); vipd binds VIPs as /%d", ip, bits, host)
		}
		out = append(out, netip.PrefixFrom(ip, host).String())
	}
	if len(out) == 0 {
		k.b.warn("address is empty: set VIPD_ADDRESS by hand")
		return "", false
	}
	return strings.Join(out, ","), true
}

func (k *kv) addressSource() string {
	var parts []string
	for _, n := range []string{"address", "vip_address", "vip_subnet", "vip_cidr"} {
		if v, ok := k.src.lookup(n); ok && v.Value != "" {
			parts = append(parts, n+"="+v.Value)
		}
	}
	return strings.Join(parts, ", ")
}

func (k *kv) nodeName() {
	v, ok := k.get("vip_nodename")
	switch fp := k.field("vip_nodename"); {
	case fp == "spec.nodeName":
		k.b.comment("vip_nodename came from the Pod's spec.nodeName. vipd names the node after the host name\n(VIPD_NODE_NAME), which is the kubelet's node name unless kubelet runs with --hostname-override.")
	case fp != "":
		k.b.warn("vip_nodename came from the Pod field %s; set VIPD_NODE_NAME on each node if the host name is not right", fp)
	case ok && v != "":
		k.b.set("VIPD_NODE_NAME", v, "from vip_nodename (set it per node, or remove it to use the host name).")
	}
}

func (k *kv) health(mode string) {
	url := ""
	comment := ""
	if p, ok := k.get("port"); ok && p != "" && p != "6443" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			k.b.warn("port=%q is not a TCP port; the health URL keeps port 6443", p)
		} else {
			url = fmt.Sprintf("https://127.0.0.1:%d/livez", n)
			comment = "from port=" + p + ": vipd checks the local apiserver on that port."
		}
	}
	if a, ok := k.get("control_plane_health_check_address"); ok && a != "" {
		url, comment = a, "from control_plane_health_check_address."
	}
	if url != "" {
		k.b.set("VIPD_HEALTH_URL", url, comment)
	}
	if mode == "l2" {
		k.b.comment("kube-vip's ARP mode never checked the local apiserver. vipd releases the VIP when\nVIPD_HEALTH_URL (default https://127.0.0.1:6443/livez) fails VIPD_FAIL_THRESHOLD times in a row.")
	}
	seconds := func(env, name string) {
		if v, ok := k.get(name); ok && v != "" {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil || n == 0 {
				k.b.warn("%s=%q is not a positive number of seconds; not migrated", name, v)
				return
			}
			k.b.set(env, fmt.Sprintf("%ds", n), "from "+name+"="+v+".")
		}
	}
	seconds("VIPD_HEALTH_INTERVAL", "control_plane_health_check_period_seconds")
	seconds("VIPD_HEALTH_TIMEOUT", "control_plane_health_check_timeout_seconds")
	if v, ok := k.get("control_plane_health_check_failure_threshold"); ok && v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			k.b.warn("control_plane_health_check_failure_threshold=%q is not a positive number; not migrated", v)
		} else {
			k.b.set("VIPD_FAIL_THRESHOLD", strconv.FormatUint(n, 10), "from control_plane_health_check_failure_threshold.")
		}
	}
	if v, ok := k.get("control_plane_health_check_ca_path"); ok && v != "" {
		k.b.set("VIPD_HEALTH_CA_FILE", v, "from control_plane_health_check_ca_path.")
	}
}

func (k *kv) election(mode string) {
	le, leSet := k.get("vip_leaderelection")
	leOn := leSet && le != "" && isTrue(le)
	dur, _ := k.get("vip_leaseduration")
	renew, _ := k.get("vip_renewdeadline")
	retry, _ := k.get("vip_retryperiod")
	name, _ := k.get("vip_leasename")
	k.used["cp_namespace"] = false
	rate, rateSet := k.get("vip_arpRate")
	if leSet && le != "" {
		if _, err := strconv.ParseBool(le); err != nil {
			k.b.warn("vip_leaderelection=%q is not a boolean", le)
		}
	}
	switch mode {
	case "l2":
		if leSet && le != "" && !leOn {
			k.b.warn("vip_leaderelection=false did nothing for the control-plane VIP in ARP mode: kube-vip still elected a leader through its Lease. vipd elects one holder by gossip")
		}
		lease := "the Kubernetes Lease " + orDefault(name, "plndr-cp-lock") + " (duration " + orDefault(dur, "15") + "s, renew deadline " +
			orDefault(renew, "10") + "s, retry " + orDefault(retry, "2") + "s)"
		k.b.comment("kube-vip elected the holder through " + lease + ",\n" +
			"through the apiserver the VIP fronts. vipd elects without the Kubernetes API: the nodes gossip on\n" +
			"VIPD_GOSSIP_BIND (default 0.0.0.0:7950, TCP and UDP) and a dead holder is replaced within about 2 s.\n" +
			"List the other control-plane nodes (host[:port]) here; a first node may start with none.")
		k.b.suggest("VIPD_PEERS", "", "")
		k.b.warn("VIPD_PEERS is empty: the other control-plane nodes are not in kube-vip's configuration; set VIPD_PEERS on every node before vipd runs on more than one")
		r := "3000"
		if rateSet && rate != "" {
			r = rate
		}
		k.b.comment("vip_arpRate=" + r + " ms: kube-vip sent gratuitous ARP only on that ticker, even after a takeover.\n" +
			"vipd announces at once on takeover, repeats about every 1.1 s for a few seconds, then refreshes\nslowly; it has no setting for this.")
	case "bgp":
		if leOn {
			k.b.warn("vip_leaderelection=true made kube-vip advertise from one elected node only; vipd's bgp mode advertises from every healthy node (ECMP): the routers need multipath (maximum-paths)")
		}
		if rateSet {
			k.b.comment("vip_arpRate=" + rate + ": no ARP in bgp mode.")
		}
	}
}

func isTrue(s string) bool {
	b, err := strconv.ParseBool(s)
	return err == nil && b
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

func (k *kv) ignoreBGP() {
	for _, n := range []string{"bgp_routerid", "bgp_as", "bgp_peers", "bgp_peeraddress", "bgp_peeras", "bgp_peerpass", "bgp_multihop", "bgp_hold_time", "bgp_keepalive_interval"} {
		if v, ok := k.src.lookup(n); ok {
			k.used[n] = true
			if v.Value != "" && n != "bgp_peeras" && n != "bgp_as" && !(n == "bgp_multihop" && !isTrue(v.Value)) {
				val := v.Value
				switch n {
				case "bgp_peerpass":
					val = "<redacted>" // a password is never echoed
				case "bgp_peers":
					val = redactKubeVIPPeers(val)
				}
				k.b.warn("%s=%s is a BGP setting but BGP is not enabled (bgp_enable); not migrated", n, val)
			}
		}
	}
}

func (k *kv) bgp() error {
	as, ok := k.get("bgp_as")
	if !ok || as == "" {
		as = "65000"
		k.b.set("VIPD_BGP_LOCAL_AS", as, "bgp_as was not set: kube-vip's default AS 65000.")
	} else if n, err := strconv.ParseUint(as, 10, 32); err != nil || n == 0 {
		return fmt.Errorf("bgp_as=%q: not an AS number (1 to 4294967295)", as)
	} else {
		k.b.set("VIPD_BGP_LOCAL_AS", as, "from bgp_as.")
	}
	rid, _ := k.get("bgp_routerid")
	switch fp := k.field("bgp_routerid"); {
	case fp != "":
		k.b.suggest("VIPD_BGP_ROUTER_ID", "", "bgp_routerid came from the Pod field "+fp+" (the node's address with hostNetwork):\nset this node's IPv4 address here, on each node.")
		k.b.warn("bgp_routerid came from the Pod field %s: set VIPD_BGP_ROUTER_ID to each node's IPv4 address", fp)
	case rid != "":
		if a, err := netip.ParseAddr(rid); err != nil || !a.Is4() {
			k.b.warn("bgp_routerid=%q is not an IPv4 address; vipd needs a dotted-quad router ID", rid)
		}
		k.b.set("VIPD_BGP_ROUTER_ID", rid, "from bgp_routerid (it differs per node).")
	default:
		k.b.suggest("VIPD_BGP_ROUTER_ID", "", "bgp_routerid was not set: set this node's IPv4 address here, on each node.")
	}

	var peers []kvPeer
	if s, ok := k.get("bgp_peers"); ok && s != "" {
		p, err := parseKubeVIPPeers(s)
		if err != nil {
			return err
		}
		peers = p
	}
	if addr, ok := k.get("bgp_peeraddress"); ok && addr != "" {
		entry := addr
		if a, err := netip.ParseAddr(addr); err == nil && a.Is6() {
			entry = "[" + addr + "]"
		}
		peerAS, _ := k.get("bgp_peeras")
		pass, _ := k.get("bgp_peerpass")
		mh := k.boolean("bgp_multihop")
		p, err := parseKubeVIPPeer(entry + ":" + orDefault(peerAS, "65000"))
		if err != nil {
			return fmt.Errorf("bgp_peeraddress=%q, bgp_peeras=%q: %w", addr, peerAS, err)
		}
		p.Password, p.Multihop = pass, mh
		peers = append(peers, p)
	} else {
		k.get("bgp_peeras")
		if pass, _ := k.get("bgp_peerpass"); pass != "" {
			k.b.warn("bgp_peerpass is set but bgp_peeraddress is empty; kube-vip ignored it")
		}
		if k.boolean("bgp_multihop") {
			k.b.warn("bgp_multihop=true only applied to bgp_peeraddress, which is empty; kube-vip ignored it")
		}
	}
	hold := k.seconds("bgp_hold_time")
	keep := k.seconds("bgp_keepalive_interval")

	var out []string
	var bfdPeers, noBFDPeers []string
	var bfd *kvPeer
	for _, p := range peers {
		if p.Unnumbered != "" {
			k.b.warn("unsupported: BGP unnumbered peer on interface %s (unnumbered:%s): vipd needs the peer's address; add it to VIPD_BGP_PEERS by hand", p.Unnumbered, p.Unnumbered)
			continue
		}
		if p.MPBGP != "" {
			k.b.warn("unsupported: MP-BGP options %q for peer %s: vipd advertises each VIP family with the session address as next hop", p.MPBGP, p.Address)
		}
		if strings.ContainsAny(p.Password, ":,") {
			k.b.warn("the password of peer %s contains ':' or ',', which VIPD_BGP_PEERS cannot express; change the password", p.Address)
		}
		vp := vipdPeer{Address: p.Address, AS: p.AS, Port: p.Port, Password: p.Password, HoldSec: hold, KeepSec: keep}
		if p.Multihop {
			vp.Multihop = 50 // kube-vip's fixed eBGP multihop TTL
		}
		out = append(out, vp.String())
		if p.BFD {
			bfdPeers = append(bfdPeers, p.Address)
			if bfd == nil {
				pp := p
				bfd = &pp
			} else if bfd.BFDRx != p.BFDRx || bfd.BFDTx != p.BFDTx || bfd.BFDMult != p.BFDMult {
				k.b.warn("BFD timers differ between peers %s and %s; vipd uses one setting for all peers (the first peer's)", bfd.Address, p.Address)
			}
		} else {
			noBFDPeers = append(noBFDPeers, p.Address)
		}
	}
	comment := "from bgp_peers / bgp_peeraddress: address:as[:option=value...]."
	if hold != 0 || keep != 0 {
		comment += "\nhold and keepalive come from bgp_hold_time / bgp_keepalive_interval."
	} else {
		comment += "\nkube-vip used hold 30 s / keepalive 10 s; vipd offers 9 s / 3 s unless hold=/keepalive= are given."
	}
	if len(out) == 0 {
		k.b.suggest("VIPD_BGP_PEERS", "", "No BGP peer in kube-vip's configuration: add the routers, address:as[:option=value...].")
		k.b.warn("no usable BGP peer found: set VIPD_BGP_PEERS by hand")
	} else {
		k.b.set("VIPD_BGP_PEERS", strings.Join(out, ","), comment)
	}
	if bfd != nil {
		k.b.set("VIPD_BFD_ENABLED", "true", "kube-vip enabled BFD for peer(s) "+strings.Join(bfdPeers, ", ")+"; vipd enables BFD for every peer.")
		k.b.set("VIPD_BFD_RX_INTERVAL", fmt.Sprintf("%dms", bfd.BFDRx), "")
		k.b.set("VIPD_BFD_TX_INTERVAL", fmt.Sprintf("%dms", bfd.BFDTx), "")
		k.b.set("VIPD_BFD_DETECT_MULT", strconv.FormatUint(uint64(bfd.BFDMult), 10), "")
		if len(noBFDPeers) > 0 {
			k.b.warn("kube-vip ran BFD only with %s; vipd runs it with every peer, so %s must answer BFD too (or leave VIPD_BFD_ENABLED=false)",
				strings.Join(bfdPeers, ", "), strings.Join(noBFDPeers, ", "))
		}
	}
	return nil
}

// seconds parses a kube-vip seconds value; invalid values are warned.
func (k *kv) seconds(name string) uint64 {
	v, ok := k.get(name)
	if !ok || v == "" {
		return 0
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n == 0 {
		k.b.warn("%s=%q is not a positive number of seconds; not migrated", name, v)
		return 0
	}
	return n
}

func (k *kv) metrics() {
	v, ok := k.get("prometheus_server")
	switch {
	case !ok:
		k.b.comment("kube-vip served metrics on :2112 (its default). vipd serves /metrics, /status and /healthz on\nVIPD_METRICS_ADDRESS (default 127.0.0.1:9469); the metric names are vipd_*, not kube_vip_*.")
	case v == "":
		k.b.comment("prometheus_server was empty (kube-vip metrics off). vipd always serves /metrics, /status and\n/healthz on VIPD_METRICS_ADDRESS (default 127.0.0.1:9469).")
	default:
		k.b.suggest("VIPD_METRICS_ADDRESS", v, "from prometheus_server="+v+". Enable it only after kube-vip is gone: both cannot listen on the port\nat once. The metric names are vipd_*, not kube_vip_*.")
	}
}

// logLevel maps vip_loglevel, whose meaning changed in kube-vip v0.9.0
// (logrus 0..6 before, slog -4..8 since).
func (k *kv) logLevel() {
	v, ok := k.get("vip_loglevel")
	if !ok || v == "" {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		k.b.warn("vip_loglevel=%q is not a number; not migrated", v)
		return
	}
	major, minor, known := imageVersion(k.src.Image)
	slogEra := known && (major > 0 || minor >= 9)
	var level, basis string
	switch {
	case known && !slogEra:
		level, basis = logrusLevel(n), "logrus levels (kube-vip before v0.9.0)"
	case known:
		level, basis = slogLevel(n), "slog levels (kube-vip v0.9.0 and later)"
	default:
		level = slogLevel(n)
		basis = "slog levels (kube-vip v0.9.0 and later); the image version is unknown"
		if n >= 0 && n <= 6 && n != 0 && n != 4 {
			alt := logrusLevel(n)
			if alt != level {
				k.b.warn("vip_loglevel=%d means %s under kube-vip v0.9.0+ (slog) but %s under older versions (logrus); using %s, check VIPD_LOG_LEVEL", n, level, alt, level)
			}
		}
	}
	k.b.set("VIPD_LOG_LEVEL", level, fmt.Sprintf("from vip_loglevel=%d, read as %s.", n, basis))
}

func slogLevel(n int) string {
	switch {
	case n <= -4:
		return "debug"
	case n < 4:
		return "info"
	case n < 8:
		return "warn"
	default:
		return "error"
	}
}

func logrusLevel(n int) string {
	switch {
	case n >= 5:
		return "debug"
	case n == 4:
		return "info"
	case n == 3:
		return "warn"
	default:
		return "error"
	}
}

// imageVersion extracts vMAJOR.MINOR from an image reference's tag.
func imageVersion(image string) (major, minor int, ok bool) {
	ref, _, _ := strings.Cut(image, "@")
	i := strings.LastIndexByte(ref, ':')
	if i < 0 || strings.Contains(ref[i:], "/") {
		return 0, 0, false
	}
	tag := strings.TrimPrefix(ref[i+1:], "v")
	parts := strings.SplitN(tag, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return ma, mi, true
}

// rest reports every setting the translation has not consumed.
func (k *kv) rest(svcOn bool) {
	on := map[string]bool{featServices: svcOn}
	for _, n := range []string{"lb_enable", "vip_routingtable", "vip_wireguard", "vip_ddns", "zebra_enable"} {
		if v, ok := k.src.lookup(n); ok && isTrue(v.Value) {
			on[kubeVIPOther[n].feature] = true
		}
	}
	if v, ok := k.src.lookup("address"); ok && v.Value != "" {
		if _, err := netip.ParseAddr(strings.Split(v.Value, ",")[0]); err != nil {
			on[featDDNS] = true
		}
	}
	var notes []string
	seen := map[string]bool{}
	for _, v := range k.src.Vars {
		if k.used[v.Name] || seen[v.Name] {
			continue
		}
		seen[v.Name] = true
		eff, _ := k.src.lookup(v.Name)
		val := eff.Value
		if eff.FieldPath != "" {
			val = "(from " + eff.FieldPath + ")"
		}
		set := val != "" && !(strings.EqualFold(val, "false") || val == "0")
		o, known := kubeVIPOther[v.Name]
		switch {
		case !known:
			k.b.warn("%s is not a kube-vip setting (names are case-sensitive); ignored", v.Name)
			continue
		case o.kind == kindDead && set && val != "0s":
			k.b.warn("%s=%s did nothing: %s", v.Name, val, o.why)
			continue
		case o.kind == kindFeature && set:
			k.b.warn("unsupported: %s: %s", o.feature, o.why)
			continue
		case o.kind == kindFeatureSetting && on[o.feature]:
			// The feature itself is already reported; list the setting.
			notes = append(notes, fmt.Sprintf("%s=%s: part of %s, not supported.", v.Name, val, o.feature))
			continue
		case o.kind == kindChanged && set:
			k.b.warn("%s=%s has no vipd equivalent: %s", v.Name, val, o.why)
			continue
		}
		why := o.why
		if why == "" {
			why = "only used by " + o.feature + ", which is off"
		}
		if o.kind == kindFeature {
			why = o.feature + " is off"
		}
		notes = append(notes, fmt.Sprintf("%s=%s: %s.", v.Name, val, why))
	}
	if len(notes) > 0 {
		slices.Sort(notes)
		k.b.comment("Not carried over from kube-vip:\n  " + strings.Join(notes, "\n  "))
	}
}
