package kube

import (
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// poolSnapshot is what FLIPOP's pool metrics report for one pool.
type poolSnapshot struct {
	valid                       bool
	namespace, name, provider   string
	dns                         string
	assignable, assigned        int
	unfulfilled                 int
	ipState                     map[string]IPState
	ipNode                      map[string][2]string // ip -> provider ID, node name
	assignments, assignmentErrs map[string]int
}

// dnsSnapshot is what FLIPOP's NodeDNSRecordSet metric reports.
type dnsSnapshot struct {
	valid                          bool
	namespace, name, provider, dns string
	records                        int
}

// snapshot renders the pool's metrics by FLIPOP's rules: every managed IP
// (not the disabled ones) has an ip_state series and ip_assignments /
// ip_assignment_errors counters (0 included); an IP with a provider ID (a
// node, a non-matching droplet, or the target of a failed assignment) has
// an ip_node series, node="" when that is not a matching node, and counts
// as "assigned"; "available" nodes are the matching ones waiting for an IP,
// without those held back after a failed assignment.
func (c *poolCore) snapshot(p *FloatingIPPool, fqdn string, nodes []poolNode) poolSnapshot {
	st := c.status(nodes)
	s := poolSnapshot{
		valid: true, namespace: p.Namespace, name: p.Name, provider: p.Spec.Provider, dns: fqdn,
		assignable:     len(st.AssignableNodes),
		ipState:        map[string]IPState{},
		ipNode:         map[string][2]string{},
		assignments:    map[string]int{},
		assignmentErrs: map[string]int{},
	}
	if p.Spec.DesiredIPs > len(c.ips) {
		s.unfulfilled = p.Spec.DesiredIPs - len(c.ips)
	}
	for _, ip := range c.ips {
		is := st.IPs[ip]
		s.ipState[ip] = is.State
		s.assignments[ip] = c.assignments[ip]
		s.assignmentErrs[ip] = c.assignErrors[ip]
		if is.ProviderID != "" {
			s.ipNode[ip] = [2]string{is.ProviderID, is.NodeName}
			s.assigned++
		}
	}
	return s
}

func (o *operator) setPoolMetrics(key string, s poolSnapshot) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e := o.pools[key]; e != nil {
		e.metrics = s
	}
}

func (o *operator) setDNSMetrics(key string, s dnsSnapshot) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e := o.dnsSets[key]; e != nil {
		e.metrics = s
	}
}

func (o *operator) snapshots() ([]poolSnapshot, []dnsSnapshot) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ps []poolSnapshot
	for _, e := range o.pools {
		if e.metrics.valid {
			ps = append(ps, e.metrics)
		}
	}
	var ds []dnsSnapshot
	for _, e := range o.dnsSets {
		if e.metrics.valid {
			ds = append(ds, e.metrics)
		}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].namespace+"/"+ps[i].name < ps[j].namespace+"/"+ps[j].name })
	return ps, ds
}

// collector exposes FLIPOP's controller metrics for whichever operator is
// running (none while this instance is not the leader).
type collector struct {
	mu  sync.Mutex
	cur *operator

	nodeStatus, assignErrs, assigns, ipNode, ipState, unfulfilled, records *prometheus.Desc
}

func newCollector() *collector {
	pool := []string{"namespace", "name", "provider", "dns"}
	with := func(extra ...string) []string { return append(append([]string{}, pool...), extra...) }
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &collector{
		nodeStatus:  d("flipop_floatingippoolcontroller_node_status", "Matching nodes by status (available: waiting for an IP, assigned: holding one).", with("status")),
		assignErrs:  d("flipop_floatingippoolcontroller_ip_assignment_errors", "Failed IP assignments.", with("ip")),
		assigns:     d("flipop_floatingippoolcontroller_ip_assignments", "IP assignments made.", with("ip")),
		ipNode:      d("flipop_floatingippoolcontroller_ip_node", "Node holding each IP (value 1).", with("ip", "provider_id", "node")),
		ipState:     d("flipop_floatingippoolcontroller_ip_state", "State of each IP (value 1).", with("ip", "state")),
		unfulfilled: d("flipop_floatingippoolcontroller_unfulfilled_ips", "desiredIPs minus the IPs the pool has.", pool),
		records:     d("flipop_nodednsrecordset_records", "A records written for the NodeDNSRecordSet.", pool),
	}
}

func (c *collector) set(o *operator) {
	c.mu.Lock()
	c.cur = o
	c.mu.Unlock()
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.nodeStatus, c.assignErrs, c.assigns, c.ipNode, c.ipState, c.unfulfilled, c.records} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	o := c.cur
	c.mu.Unlock()
	if o == nil {
		return
	}
	pools, sets := o.snapshots()
	for _, p := range pools {
		l := []string{p.namespace, p.name, p.provider, p.dns}
		with := func(extra ...string) []string { return append(append([]string{}, l...), extra...) }
		ch <- prometheus.MustNewConstMetric(c.nodeStatus, prometheus.GaugeValue, float64(p.assignable), with("available")...)
		ch <- prometheus.MustNewConstMetric(c.nodeStatus, prometheus.GaugeValue, float64(p.assigned), with("assigned")...)
		ch <- prometheus.MustNewConstMetric(c.unfulfilled, prometheus.GaugeValue, float64(p.unfulfilled), l...)
		for ip, st := range p.ipState {
			ch <- prometheus.MustNewConstMetric(c.ipState, prometheus.GaugeValue, 1, with(ip, string(st))...)
		}
		for ip, pn := range p.ipNode {
			ch <- prometheus.MustNewConstMetric(c.ipNode, prometheus.GaugeValue, 1, with(ip, pn[0], pn[1])...)
		}
		for ip, n := range p.assignments {
			ch <- prometheus.MustNewConstMetric(c.assigns, prometheus.CounterValue, float64(n), with(ip)...)
		}
		for ip, n := range p.assignmentErrs {
			ch <- prometheus.MustNewConstMetric(c.assignErrs, prometheus.CounterValue, float64(n), with(ip)...)
		}
	}
	for _, s := range sets {
		ch <- prometheus.MustNewConstMetric(c.records, prometheus.GaugeValue, float64(s.records), s.namespace, s.name, s.provider, s.dns)
	}
}
