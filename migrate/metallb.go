package migrate

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// MetalLB's API (metallb.io/v1beta1), the fields vipd reads. Field names
// are MetalLB's documented ones.
type mlbMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type mlbSelector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty" yaml:"matchLabels,omitempty"`
	MatchExpressions []mlbRequirement  `json:"matchExpressions,omitempty" yaml:"matchExpressions,omitempty"`
}

type mlbRequirement struct {
	Key      string   `json:"key" yaml:"key"`
	Operator string   `json:"operator" yaml:"operator"`
	Values   []string `json:"values,omitempty" yaml:"values,omitempty"`
}

type mlbObject struct {
	APIVersion string  `json:"apiVersion"`
	Kind       string  `json:"kind"`
	Metadata   mlbMeta `json:"metadata"`
	Spec       struct {
		// IPAddressPool
		Addresses         []string `json:"addresses"`
		AutoAssign        *bool    `json:"autoAssign"`
		AvoidBuggyIPs     bool     `json:"avoidBuggyIPs"`
		ServiceAllocation *struct {
			Priority           int32         `json:"priority"`
			Namespaces         []string      `json:"namespaces"`
			NamespaceSelectors []mlbSelector `json:"namespaceSelectors"`
			ServiceSelectors   []mlbSelector `json:"serviceSelectors"`
		} `json:"serviceAllocation"`
		// L2Advertisement and BGPAdvertisement
		IPAddressPools         []string      `json:"ipAddressPools"`
		IPAddressPoolSelectors []mlbSelector `json:"ipAddressPoolSelectors"`
		NodeSelectors          []mlbSelector `json:"nodeSelectors"`
		Interfaces             []string      `json:"interfaces"`
		AggregationLength      *int32        `json:"aggregationLength"`
		AggregationLengthV6    *int32        `json:"aggregationLengthV6"`
		LocalPref              *uint32       `json:"localPref"`
		Communities            []string      `json:"communities"`
		Peers                  []string      `json:"peers"`
		// BGPPeer
		MyASN       uint32 `json:"myASN"`
		PeerASN     uint32 `json:"peerASN"`
		PeerAddress string `json:"peerAddress"`
		PeerPort    uint16 `json:"peerPort"`
		Password    string `json:"password"`
		EBGPMulti   bool   `json:"ebgpMultiHop"`
		BFDProfile  string `json:"bfdProfile"`
	} `json:"spec"`
}

func (o *mlbObject) ref() string {
	if o.Metadata.Namespace != "" {
		return o.Kind + " " + o.Metadata.Namespace + "/" + o.Metadata.Name
	}
	return o.Kind + " " + o.Metadata.Name
}

// IPPoolDoc is one generated vipd IPPool with the notes written above it.
type IPPoolDoc struct {
	Notes []string
	Pool  IPPoolOut
}

// IPPoolOut is the vipd.io/v1alpha1 IPPool written out (the field names of
// api/v1alpha1, which this package may not import).
type IPPoolOut struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Addresses         []string     `yaml:"addresses"`
		Mode              string       `yaml:"mode"`
		NodeSelector      *mlbSelector `yaml:"nodeSelector,omitempty"`
		ServiceAllocation *allocOut    `yaml:"serviceAllocation,omitempty"`
		AvoidBuggyIPs     bool         `yaml:"avoidBuggyIPs,omitempty"`
		AutoAssign        *bool        `yaml:"autoAssign,omitempty"`
	} `yaml:"spec"`
}

type allocOut struct {
	Priority          int32        `yaml:"priority,omitempty"`
	Namespaces        []string     `yaml:"namespaces,omitempty"`
	NamespaceSelector *mlbSelector `yaml:"namespaceSelector,omitempty"`
	ServiceSelector   *mlbSelector `yaml:"serviceSelector,omitempty"`
}

// PoolsResult is the outcome of `vipd migrate metallb`: IPPool objects and
// the warnings an operator must read.
type PoolsResult struct {
	Header   []string
	Pools    []IPPoolDoc
	Warnings []string
}

// WriteYAML writes the pools as a multi-document YAML file for kubectl
// apply, each preceded by its notes as comments.
func (r PoolsResult) WriteYAML(w io.Writer) error {
	var b bytes.Buffer
	for _, h := range r.Header {
		b.WriteString(commentLines(h))
	}
	for _, d := range r.Pools {
		b.WriteString("---\n")
		for _, n := range d.Notes {
			b.WriteString(commentLines(n))
		}
		var doc bytes.Buffer
		enc := yamlv3.NewEncoder(&doc)
		enc.SetIndent(2)
		if err := enc.Encode(d.Pool); err != nil {
			return fmt.Errorf("encode IPPool %s: %w", d.Pool.Metadata.Name, err)
		}
		_ = enc.Close()
		b.Write(doc.Bytes())
	}
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write pools: %w", err)
	}
	return nil
}

// WriteWarnings writes one "warning: " line per warning.
func (r PoolsResult) WriteWarnings(w io.Writer) error {
	return Result{Warnings: r.Warnings}.WriteWarnings(w)
}

func commentLines(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if l == "" {
			b.WriteString("#\n")
			continue
		}
		b.WriteString("# " + l + "\n")
	}
	return b.String()
}

// MetalLB translates MetalLB's IPAddressPool, L2Advertisement and
// BGPAdvertisement objects (metallb.io/v1beta1, a multi-document YAML file
// or a List) into vipd IPPools: the addresses, autoAssign, avoidBuggyIPs
// and serviceAllocation carry over; the mode comes from the advertisements
// that select the pool; their node selectors become the pool's. What has
// no vipd equivalent is a warning. BGPPeers are turned into a suggestion
// for VIPD_BGP_PEERS.
func MetalLB(r io.Reader) (PoolsResult, error) {
	data, err := readAll(r)
	if err != nil {
		return PoolsResult{}, err
	}
	objs, err := decodeMetalLB(data)
	if err != nil {
		return PoolsResult{}, err
	}
	var res PoolsResult
	var pools, l2, bgp []*mlbObject
	for _, o := range objs {
		if o.Kind == "" {
			return PoolsResult{}, fmt.Errorf("an object without kind: expected MetalLB's IPAddressPool, L2Advertisement or BGPAdvertisement")
		}
		if !strings.HasPrefix(o.APIVersion, "metallb.io/") {
			if o.Kind == "ConfigMap" {
				res.Warnings = append(res.Warnings, fmt.Sprintf("%s: MetalLB's ConfigMap configuration (before v0.13) is not read; convert it to IPAddressPool objects first (MetalLB's configmaptocrs) and migrate those", o.ref()))
				continue
			}
			res.Warnings = append(res.Warnings, fmt.Sprintf("%s (%s): not a MetalLB object; skipped", o.ref(), o.APIVersion))
			continue
		}
		switch o.Kind {
		case "IPAddressPool":
			pools = append(pools, o)
		case "L2Advertisement":
			l2 = append(l2, o)
		case "BGPAdvertisement":
			bgp = append(bgp, o)
		case "BGPPeer":
			res.Warnings = append(res.Warnings, bgpPeerHint(o))
		case "BFDProfile", "Community":
			res.Warnings = append(res.Warnings, fmt.Sprintf("%s: no IPPool equivalent; vipd's BFD and communities are node settings (VIPD_BFD_*; communities are not supported)", o.ref()))
		default:
			res.Warnings = append(res.Warnings, fmt.Sprintf("%s (%s): no vipd equivalent; skipped", o.ref(), o.APIVersion))
		}
	}
	if len(pools) == 0 {
		return PoolsResult{}, errors.New("no MetalLB IPAddressPool found in the input")
	}
	res.Header = []string{strings.Join([]string{
		"vipd IPPools translated from MetalLB by `vipd migrate metallb` (docs/pools.md).",
		"Apply with kubectl apply -f; run vipd-controllers with VIPD_CONTROLLERS=services",
		"and the nodes with VIPD_POOLS=on. Services keep their MetalLB annotations until",
		"renamed: metallb.universe.tf/loadBalancerIPs -> vipd.io/loadBalancerIPs,",
		"metallb.universe.tf/address-pool -> vipd.io/ip-pool,",
		"metallb.universe.tf/allow-shared-ip -> vipd.io/sharing-key, and",
		"spec.loadBalancerClass (if set for MetalLB) -> vipd.io/lb, or set",
		"VIPD_SERVICES_DEFAULT_CLASS=true for Services without a class.",
	}, "\n")}
	sort.SliceStable(pools, func(i, j int) bool { return pools[i].Metadata.Name < pools[j].Metadata.Name })
	seen := map[string]string{}
	for _, p := range pools {
		if prev, dup := seen[p.Metadata.Name]; dup {
			res.Warnings = append(res.Warnings, fmt.Sprintf("%s: a pool of that name was already translated from %s (IPPools are cluster-scoped); skipped", p.ref(), prev))
			continue
		}
		seen[p.Metadata.Name] = p.ref()
		doc, warns, err := translatePool(p, l2, bgp)
		if err != nil {
			return PoolsResult{}, err
		}
		res.Pools = append(res.Pools, doc)
		res.Warnings = append(res.Warnings, warns...)
	}
	return res, nil
}

func decodeMetalLB(data []byte) ([]*mlbObject, error) {
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	var out []*mlbObject
	for doc := 1; ; doc++ {
		var node yamlv3.Node
		err := dec.Decode(&node)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s (document %d)", yamlError(err), doc)
		}
		raw, err := yamlv3.Marshal(&node)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		var probe struct {
			Kind  string    `json:"kind"`
			Items []rawJSON `json:"items"`
		}
		if err := yaml.Unmarshal(raw, &probe); err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if probe.Kind == "" && len(bytes.TrimSpace(raw)) <= 4 {
			continue // empty document
		}
		var items [][]byte
		if strings.HasSuffix(probe.Kind, "List") {
			for _, it := range probe.Items {
				items = append(items, []byte(it))
			}
		} else {
			items = [][]byte{raw}
		}
		for _, it := range items {
			var o mlbObject
			if err := yaml.Unmarshal(it, &o); err != nil {
				return nil, fmt.Errorf("document %d: %w", doc, err)
			}
			out = append(out, &o)
		}
	}
	return out, nil
}

// rawJSON keeps list items raw (sigs.k8s.io/yaml decodes through
// encoding/json).
type rawJSON []byte

func (r *rawJSON) UnmarshalJSON(b []byte) error {
	*r = append((*r)[:0], b...)
	return nil
}

func translatePool(p *mlbObject, l2, bgp []*mlbObject) (IPPoolDoc, []string, error) {
	var doc IPPoolDoc
	var warns []string
	warn := func(format string, args ...any) {
		warns = append(warns, p.ref()+": "+fmt.Sprintf(format, args...))
	}
	out := &doc.Pool
	out.APIVersion, out.Kind = "vipd.io/v1alpha1", "IPPool"
	out.Metadata.Name = p.Metadata.Name
	doc.Notes = append(doc.Notes, "from "+p.ref())
	if len(p.Spec.Addresses) == 0 {
		return doc, nil, fmt.Errorf("%s: spec.addresses is empty", p.ref())
	}
	for _, a := range p.Spec.Addresses {
		norm, err := normaliseAddresses(a)
		if err != nil {
			return doc, nil, fmt.Errorf("%s: spec.addresses: %w", p.ref(), err)
		}
		out.Spec.Addresses = append(out.Spec.Addresses, norm)
	}
	out.Spec.AvoidBuggyIPs = p.Spec.AvoidBuggyIPs
	if p.Spec.AutoAssign != nil && !*p.Spec.AutoAssign {
		f := false
		out.Spec.AutoAssign = &f
	}
	if sa := p.Spec.ServiceAllocation; sa != nil {
		a := &allocOut{Priority: sa.Priority, Namespaces: sa.Namespaces}
		// A restriction vipd cannot express must not widen the pool:
		// then only Services that name it (vipd.io/ip-pool) draw from it.
		narrow := func(what string, n int) {
			warn("serviceAllocation.%s has %d selectors (any of them); vipd takes one: not translated, and autoAssign is set to false so the pool serves no more Services than before (only those naming it in vipd.io/ip-pool); narrow serviceAllocation by hand, then remove autoAssign", what, n)
			f := false
			out.Spec.AutoAssign = &f
		}
		a.NamespaceSelector = oneSelector(sa.NamespaceSelectors, func(n int) { narrow("namespaceSelectors", n) })
		a.ServiceSelector = oneSelector(sa.ServiceSelectors, func(n int) { narrow("serviceSelectors", n) })
		if sa.Priority != 0 {
			doc.Notes = append(doc.Notes, "serviceAllocation.priority: higher first, as in MetalLB")
		}
		if a.Priority != 0 || len(a.Namespaces) > 0 || a.NamespaceSelector != nil || a.ServiceSelector != nil {
			out.Spec.ServiceAllocation = a
		}
	}

	selecting := func(ads []*mlbObject) []*mlbObject {
		var outAds []*mlbObject
		for _, ad := range ads {
			if advertises(ad, p) {
				outAds = append(outAds, ad)
			}
		}
		return outAds
	}
	l2s, bgps := selecting(l2), selecting(bgp)
	var ads []*mlbObject
	switch {
	case len(l2s) > 0 && len(bgps) > 0:
		out.Spec.Mode, ads = "l2", l2s
		warn("advertised by %s and by %s; a vipd pool is announced one way: mode l2 (set mode: bgp to advertise over BGP instead)", refs(l2s), refs(bgps))
	case len(bgps) > 0:
		out.Spec.Mode, ads = "bgp", bgps
	case len(l2s) > 0:
		out.Spec.Mode, ads = "l2", l2s
	default:
		out.Spec.Mode = "l2"
		warn("no L2Advertisement or BGPAdvertisement selects it, so MetalLB allocated but did not announce its addresses; vipd nodes with VIPD_POOLS=on announce them (mode l2)")
	}
	if len(ads) > 0 {
		doc.Notes = append(doc.Notes, "mode "+out.Spec.Mode+" from "+refs(ads))
	}
	// Node selectors: every node when any advertisement has none; one
	// selector in common otherwise.
	var sels []mlbSelector
	all := false
	for _, ad := range ads {
		if len(ad.Spec.NodeSelectors) == 0 {
			all = true
		}
		for _, s := range ad.Spec.NodeSelectors {
			if !slices.ContainsFunc(sels, func(x mlbSelector) bool { return sameSelector(x, s) }) {
				sels = append(sels, s)
			}
		}
	}
	if !all {
		out.Spec.NodeSelector = oneSelector(sels, func(n int) {
			warn("the advertisements select nodes with %d different selectors (any of them); vipd takes one: nodeSelector not set, every VIPD_POOLS=on node may announce; narrow it by hand", n)
		})
	}
	for _, ad := range ads {
		if len(ad.Spec.Interfaces) > 0 {
			warn("%s limits announcements to interfaces %v; vipd announces on VIPD_INTERFACE of each node", ad.ref(), ad.Spec.Interfaces)
		}
		if ad.Spec.AggregationLength != nil || ad.Spec.AggregationLengthV6 != nil {
			warn("%s aggregates routes (aggregationLength); vipd advertises each address as a /32 or /128", ad.ref())
		}
		if ad.Spec.LocalPref != nil || len(ad.Spec.Communities) > 0 {
			warn("%s sets localPref/communities; vipd does not set BGP path attributes", ad.ref())
		}
		if len(ad.Spec.Peers) > 0 {
			warn("%s advertises to peers %v only; vipd advertises to every VIPD_BGP_PEERS peer", ad.ref(), ad.Spec.Peers)
		}
	}
	return doc, warns, nil
}

// advertises reports whether the advertisement applies to the pool: named
// in ipAddressPools, selected by ipAddressPoolSelectors, or both empty
// (every pool).
func advertises(ad, p *mlbObject) bool {
	if len(ad.Spec.IPAddressPools) == 0 && len(ad.Spec.IPAddressPoolSelectors) == 0 {
		return true
	}
	if slices.Contains(ad.Spec.IPAddressPools, p.Metadata.Name) {
		return true
	}
	for _, s := range ad.Spec.IPAddressPoolSelectors {
		if s.matches(p.Metadata.Labels) {
			return true
		}
	}
	return false
}

// matches evaluates a label selector (Kubernetes' rules; an empty
// selector matches everything).
func (s mlbSelector) matches(l map[string]string) bool {
	for k, v := range s.MatchLabels {
		if got, ok := l[k]; !ok || got != v {
			return false
		}
	}
	for _, r := range s.MatchExpressions {
		v, ok := l[r.Key]
		switch r.Operator {
		case "In":
			if !ok || !slices.Contains(r.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(r.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}

func sameSelector(a, b mlbSelector) bool {
	ja, _ := yaml.Marshal(a)
	jb, _ := yaml.Marshal(b)
	return bytes.Equal(ja, jb)
}

// oneSelector returns the single selector, nil for none, and calls many
// (returning nil) when there are several.
func oneSelector(sels []mlbSelector, many func(int)) *mlbSelector {
	switch len(sels) {
	case 0:
		return nil
	case 1:
		s := sels[0]
		return &s
	}
	many(len(sels))
	return nil
}

func refs(objs []*mlbObject) string {
	var s []string
	for _, o := range objs {
		s = append(s, o.ref())
	}
	return strings.Join(s, ", ")
}

// normaliseAddresses checks one MetalLB addresses entry (a CIDR or a range
// "first-last", spaces allowed around the dash) and writes it the way
// vipd's CRD accepts it.
func normaliseAddresses(s string) (string, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return "", fmt.Errorf("%q is not a CIDR", s)
		}
		return p.String(), nil
	}
	first, last, ok := strings.Cut(s, "-")
	if !ok {
		return "", fmt.Errorf("%q is neither a CIDR nor a first-last range", s)
	}
	a, err1 := netip.ParseAddr(strings.TrimSpace(first))
	b, err2 := netip.ParseAddr(strings.TrimSpace(last))
	if err1 != nil || err2 != nil || a.Is4() != b.Is4() {
		return "", fmt.Errorf("%q is not a range of two addresses of one family", s)
	}
	if a.Compare(b) > 0 {
		return "", fmt.Errorf("range %q starts after it ends", s)
	}
	return a.String() + "-" + b.String(), nil
}

func bgpPeerHint(o *mlbObject) string {
	addr := o.Spec.PeerAddress
	if a, err := netip.ParseAddr(addr); err == nil && a.Is6() {
		addr = "[" + addr + "]"
	}
	peer := fmt.Sprintf("%s:%d", addr, o.Spec.PeerASN)
	if o.Spec.PeerPort != 0 && o.Spec.PeerPort != 179 {
		peer += fmt.Sprintf(":port=%d", o.Spec.PeerPort)
	}
	if o.Spec.EBGPMulti {
		peer += ":multihop=true"
	}
	if o.Spec.Password != "" {
		peer += ":password=<the BGPPeer's password>" // never echo the secret
	}
	msg := fmt.Sprintf("%s: BGP peers are node settings in vipd: VIPD_BGP_LOCAL_AS=%d and VIPD_BGP_PEERS=%s", o.ref(), o.Spec.MyASN, peer)
	if o.Spec.BFDProfile != "" {
		msg += " (BFD: VIPD_BFD_ENABLED=true and VIPD_BFD_* for profile " + o.Spec.BFDProfile + ")"
	}
	return msg
}
