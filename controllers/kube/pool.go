package kube

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// poolCore is the decision logic of one FloatingIPPool, without I/O: the
// controller feeds it provider answers and the enabled (matching) nodes, and
// asks it what to call next. Every pass is level-triggered: the nodes that
// need an IP are recomputed from scratch ("enabled nodes without an active
// IP") against "IPs not active", so no node stays without an IP after an
// error, whatever happened before.
type poolCore struct {
	ips      []string // managed IPs, spec order (spec.ips[:desiredIPs])
	disabled []string // spec.ips[desiredIPs:]: reported, never touched
	info     map[string]*ipInfo
	// shared names the IPs another FloatingIPPool lists too (ip -> that
	// pool): a misconfiguration neither pool acts on.
	shared map[string]string
	others map[string]string // every IP other pools list -> that pool
	// qFront and qBack hand out queue positions: FLIPOP keeps the IPs free
	// for assignment in a queue and pushes some to its front, some to its
	// back; free IPs are handed out by position so pairings match FLIPOP's.
	qFront, qBack int64
	// everManaged holds every IP this pool managed since start, so an
	// annotation naming an IP removed from spec.ips is still cleaned up.
	everManaged map[string]bool

	pending      []string // created at the provider, not yet in spec.ips
	createRetry  backoff
	createErr    string
	coolOff      time.Duration
	lastAssign   time.Time
	nodeRetry    map[string]*backoff  // provider ID -> assign failures
	enabledSince map[string]time.Time // provider ID -> first pass it was enabled

	// Counters for FLIPOP's metrics, by IP.
	assignments  map[string]int
	assignErrors map[string]int
}

type ipInfo struct {
	owner      string // provider ID holding it ("" = unassigned), as last read or assigned
	known      bool   // owner is known (read from the provider, or assigned)
	seen       bool   // read from the provider at least once
	inProgress bool   // an assignment was issued and is not verified yet
	failed     bool   // an assignment failed or the IP vanished: owner unknown, re-read before use
	readErr    bool   // the last read failed: owner is the last known one, not reassigned meanwhile
	invalid    bool   // not an IPv4 address: never sent to the provider
	target     string // provider ID of the last failed assignment, shown in status
	errMsg     string
	check      backoff // when to read it from the provider next
	qpos       int64   // position in FLIPOP's queue of free IPs (lower first)
	onEnabled  bool    // held by an enabled node in the last pass
}

// poolNode is an enabled node as the core sees it.
type poolNode struct {
	Name       string
	ProviderID string
}

func newPoolCore() *poolCore {
	return &poolCore{
		info:         map[string]*ipInfo{},
		shared:       map[string]string{},
		everManaged:  map[string]bool{},
		nodeRetry:    map[string]*backoff{},
		enabledSince: map[string]time.Time{},
		assignments:  map[string]int{},
		assignErrors: map[string]int{},
	}
}

// setSpec applies spec.ips, desiredIPs and the cool-off. New IPs are read
// from the provider at once; IPs dropped from the spec are forgotten (never
// released at the provider). others maps every IP another FloatingIPPool
// lists to that pool: an IP listed by both is managed by neither, and an
// annotation naming another pool's IP is never touched.
func (c *poolCore) setSpec(specIPs []string, desired int, coolOff time.Duration, others map[string]string, now time.Time) {
	c.coolOff = coolOff
	ips, disabled := specIPs, []string(nil)
	if desired > 0 && len(specIPs) > desired {
		ips, disabled = specIPs[:desired], specIPs[desired:]
	}
	c.ips = dedupe(ips)
	c.disabled = dedupe(disabled)
	c.others = others
	c.shared = map[string]string{}
	keep := map[string]bool{}
	for _, ip := range append(append([]string{}, c.ips...), c.disabled...) {
		if other := others[ip]; other != "" {
			c.shared[ip] = other
		}
	}
	for _, ip := range c.ips {
		keep[ip] = true
		c.everManaged[ip] = true
		if c.info[ip] == nil {
			c.info[ip] = &ipInfo{check: backoff{next: now}, invalid: !isIPv4(ip)}
		}
	}
	for _, ip := range c.disabled {
		c.everManaged[ip] = true
	}
	for ip := range c.info {
		if !keep[ip] {
			delete(c.info, ip)
		}
	}
	var still []string
	for _, ip := range c.pending {
		if !slices.Contains(specIPs, ip) {
			still = append(still, ip)
		}
	}
	c.pending = still
}

// usable reports whether the pool acts on the IP: an IPv4 address that no
// other pool lists.
func (c *poolCore) usable(ip string) bool {
	in := c.info[ip]
	return in != nil && !in.invalid && c.shared[ip] == ""
}

// readable reports whether the pool reads the IP from the provider: any
// IPv4 address, shared ones included (reading changes nothing, and it tells
// which node holds a shared IP so that node is not given a second one).
func (c *poolCore) readable(ip string) bool {
	in := c.info[ip]
	return in != nil && !in.invalid
}

// sharedError is the status.error for IPs listed by another pool too.
func (c *poolCore) sharedError() string {
	var parts []string
	for _, ip := range append(append([]string{}, c.ips...), c.disabled...) {
		if other := c.shared[ip]; other != "" {
			parts = append(parts, fmt.Sprintf("ip %s is also listed by FloatingIPPool %s", ip, other))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "; ") + "; neither pool manages it until one list drops it"
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// pushFront and pushBack move an IP in FLIPOP's queue of free IPs.
func (c *poolCore) pushFront(in *ipInfo) { c.qFront--; in.qpos = c.qFront }
func (c *poolCore) pushBack(in *ipInfo)  { c.qBack++; in.qpos = c.qBack }

// toCreate returns how many IPs must be created now to reach desiredIPs.
func (c *poolCore) toCreate(specLen, desired int, now time.Time) int {
	n := desired - specLen - len(c.pending)
	if n <= 0 || c.createRetry.waiting(now) {
		return 0
	}
	return n
}

// created records the result of a CreateIP call.
func (c *poolCore) created(ip string, err error, now time.Time) {
	if err != nil {
		c.createErr = fmt.Sprintf("creating new ip with provider: %.1000s", err.Error())
		c.createRetry.fail(retrySchedule(err), now)
		return
	}
	c.createErr = ""
	c.createRetry = backoff{}
	c.pending = append(c.pending, ip)
}

// dueChecks lists the IPs to read from the provider now, in spec order.
func (c *poolCore) dueChecks(now time.Time) []string {
	var out []string
	for _, ip := range c.ips {
		if c.readable(ip) && !c.info[ip].check.waiting(now) {
			out = append(out, ip)
		}
	}
	return out
}

// observe records an IPToProviderID answer. As in FLIPOP, an IP read as
// unassigned goes to the front of the free queue (so IPs read in spec
// order are handed out in reverse spec order), and an IP first seen on a
// droplet goes to the back (taken from a non-matching droplet last).
func (c *poolCore) observe(ip, owner string, err error, now time.Time) {
	in := c.info[ip]
	if in == nil {
		return
	}
	switch {
	case err == nil:
		if owner == "" {
			c.pushFront(in)
		} else if !in.seen {
			c.pushBack(in)
		}
		in.owner, in.known, in.seen, in.inProgress, in.failed, in.readErr, in.errMsg, in.target = owner, true, true, false, false, false, "", ""
		in.check = backoff{next: now.Add(healthyRecheck)}
	case errors.Is(err, ErrInProgress):
		in.inProgress = true
		in.check.fail(retryFast, now)
	case errors.Is(err, ErrNotFound):
		in.owner, in.known, in.inProgress, in.failed, in.readErr, in.target = "", false, false, true, false, ""
		in.errMsg = fmt.Sprintf("ip not found at provider: %.1000s", err.Error())
		in.check.fail(retrySlow, now)
	default:
		// Keep the last known owner: a transient read error must not make
		// its node look empty-handed (and get a second IP).
		in.readErr = true
		in.errMsg = fmt.Sprintf("retrieving IPs current provider ID: %.1000s", err.Error())
		in.check.fail(retrySchedule(err), now)
	}
}

// setEnabled records which nodes match in this pass. The IP of a node
// that stopped matching goes to the back of the free queue, FLIPOP's way of
// giving the node the best chance to get it back.
func (c *poolCore) setEnabled(nodes []poolNode, now time.Time) {
	on := map[string]bool{}
	for _, n := range nodes {
		on[n.ProviderID] = true
		if _, ok := c.enabledSince[n.ProviderID]; !ok {
			c.enabledSince[n.ProviderID] = now
		}
	}
	for pid := range c.enabledSince {
		if !on[pid] {
			delete(c.enabledSince, pid)
			delete(c.nodeRetry, pid) // a node that comes back starts afresh
		}
	}
	for _, ip := range c.ips {
		in := c.info[ip]
		held := c.usable(ip) && in.known && !in.failed && on[in.owner]
		if in.onEnabled && !held {
			c.pushBack(in)
		}
		in.onEnabled = held
	}
}

// holder returns the IP held (or being assigned) by the provider ID.
func (c *poolCore) holder(pid string) (string, bool) {
	for _, ip := range c.ips {
		in := c.info[ip]
		if c.usable(ip) && in.known && in.owner == pid && !in.failed {
			return ip, true
		}
	}
	return "", false
}

// holdsShared reports whether the provider ID holds an IP this pool shares
// with another pool (a droplet holds one reserved IP: it needs no other).
func (c *poolCore) holdsShared(pid string) bool {
	for ip := range c.shared {
		if in := c.info[ip]; in != nil && in.known && !in.failed && in.owner == pid {
			return true
		}
	}
	return false
}

// needy returns the enabled nodes without an IP, in assignment order
// (first enabled first, then by name: FLIPOP enables the nodes present at
// start in one batch sorted by name, later ones as they come).
func (c *poolCore) needy(nodes []poolNode) []poolNode {
	var out []poolNode
	for _, n := range nodes {
		if _, ok := c.holder(n.ProviderID); !ok && !c.holdsShared(n.ProviderID) {
			out = append(out, n)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := c.enabledSince[out[i].ProviderID], c.enabledSince[out[j].ProviderID]
		if !a.Equal(b) {
			return a.Before(b)
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// free returns the IPs that may be given to a node, in FLIPOP's queue
// order: unassigned ones (pushed to the front each time they are read),
// then those held by something that is not an enabled node, the
// longest-released first.
func (c *poolCore) free(enabled map[string]bool) []string {
	var out []string
	for _, ip := range c.ips {
		in := c.info[ip]
		if !c.usable(ip) || !in.known || in.inProgress || in.failed || in.readErr || enabled[in.owner] {
			continue
		}
		out = append(out, ip)
	}
	sort.SliceStable(out, func(i, j int) bool { return c.info[out[i]].qpos < c.info[out[j]].qpos })
	return out
}

// assignment is one AssignIP call to make.
type assignment struct {
	IP   string
	Node poolNode
}

// nextAssignment picks the next IP and node to pair, or false (with the
// time to wake up for the cool-off, zero if none).
func (c *poolCore) nextAssignment(nodes []poolNode, now time.Time) (assignment, time.Time, bool) {
	enabled := map[string]bool{}
	for _, n := range nodes {
		enabled[n.ProviderID] = true
	}
	free := c.free(enabled)
	if len(free) == 0 {
		return assignment{}, time.Time{}, false
	}
	for _, n := range c.needy(nodes) {
		if b := c.nodeRetry[n.ProviderID]; b != nil && b.waiting(now) {
			continue
		}
		if c.coolOff > 0 && !c.lastAssign.IsZero() && now.Before(c.lastAssign.Add(c.coolOff)) {
			return assignment{}, c.lastAssign.Add(c.coolOff), false
		}
		return assignment{IP: free[0], Node: n}, time.Time{}, true
	}
	return assignment{}, time.Time{}, false
}

// assigned records an AssignIP result. Success (or in progress) moves the
// IP to the node at once (optimistically; it is verified a second later).
// A failure leaves the owner unknown until the IP is read again; the status
// names the node it was meant for, as FLIPOP's does.
func (c *poolCore) assigned(a assignment, err error, now time.Time) {
	in := c.info[a.IP]
	if in == nil {
		return
	}
	if err == nil || errors.Is(err, ErrInProgress) {
		in.owner, in.known, in.inProgress, in.failed, in.readErr, in.errMsg, in.target = a.Node.ProviderID, true, true, false, false, "", ""
		in.check = backoff{next: now.Add(retryFast.after(0))}
		in.onEnabled = true
		c.lastAssign = now
		c.assignments[a.IP]++
		delete(c.nodeRetry, a.Node.ProviderID)
		return
	}
	c.assignErrors[a.IP]++
	in.failed = true
	in.inProgress = false
	in.target = a.Node.ProviderID
	in.errMsg = fmt.Sprintf("assigning IP to node: %.1000s", err.Error())
	sched := retrySchedule(err)
	in.check.fail(sched, now)
	b := c.nodeRetry[a.Node.ProviderID]
	if b == nil {
		b = &backoff{}
		c.nodeRetry[a.Node.ProviderID] = b
	}
	b.fail(sched, now)
}

// nextWake is the earliest time something is due (provider read, node
// retry, cool-off end or create retry); zero if nothing is scheduled.
func (c *poolCore) nextWake(nodes []poolNode, now time.Time) time.Time {
	var wake time.Time
	consider := func(t time.Time) {
		if t.IsZero() {
			return
		}
		if !t.After(now) {
			t = now
		}
		if wake.IsZero() || t.Before(wake) {
			wake = t
		}
	}
	for _, ip := range c.ips {
		if c.readable(ip) {
			consider(c.info[ip].check.next)
		}
	}
	for _, n := range c.needy(nodes) {
		if b := c.nodeRetry[n.ProviderID]; b != nil {
			consider(b.next)
		}
	}
	if _, t, _ := c.nextAssignment(nodes, now); !t.IsZero() {
		consider(t)
	}
	if c.createErr != "" {
		consider(c.createRetry.next)
	}
	return wake
}

// annotations returns the reserved-IP annotation each enabled node holding
// an IP of this pool must carry.
func (c *poolCore) annotations(nodes []poolNode) map[string]string {
	out := map[string]string{}
	for _, n := range nodes {
		if ip, ok := c.holder(n.ProviderID); ok {
			out[n.Name] = ip
		}
	}
	return out
}

// ownsAnnotation reports whether an annotation value names an IP this pool
// manages or managed and no other pool lists, so it may remove it from a
// node that does not hold it (for any reason: label, taint, readiness,
// pods).
func (c *poolCore) ownsAnnotation(v string) bool { return c.everManaged[v] && c.others[v] == "" }

// activeIPs returns the IPs verified on enabled nodes, in spec order: the
// pool's DNS record set.
func (c *poolCore) activeIPs(nodes []poolNode) []string {
	enabled := map[string]bool{}
	for _, n := range nodes {
		enabled[n.ProviderID] = true
	}
	var out []string
	for _, ip := range c.ips {
		in := c.info[ip]
		if c.usable(ip) && in.known && !in.inProgress && !in.failed && enabled[in.owner] {
			out = append(out, ip)
		}
	}
	return out
}

// status renders FLIPOP's status.
func (c *poolCore) status(nodes []poolNode) FloatingIPPoolStatus {
	names := map[string]string{}
	for _, n := range nodes {
		names[n.ProviderID] = n.Name
	}
	st := FloatingIPPoolStatus{Error: c.createErr}
	if se := c.sharedError(); se != "" {
		st.Error = strings.TrimPrefix(strings.Join([]string{st.Error, se}, "; "), "; ")
	}
	if len(c.ips)+len(c.disabled) > 0 {
		st.IPs = map[string]IPStatus{}
	}
	for _, ip := range c.ips {
		in := c.info[ip]
		s := IPStatus{ProviderID: in.owner}
		switch {
		case c.shared[ip] != "":
			s = IPStatus{State: IPStateError, Error: "also listed by FloatingIPPool " + c.shared[ip], ProviderID: in.owner, NodeName: names[in.owner]}
		case in.invalid:
			s = IPStatus{State: IPStateError, Error: fmt.Sprintf("%q is not an IPv4 address (reserved IPs are IPv4)", ip)}
		case in.failed || in.readErr:
			s.State, s.Error = IPStateError, in.errMsg
			if in.target != "" {
				s.ProviderID, s.NodeName = in.target, names[in.target]
			}
		case in.inProgress || !in.known:
			s.State = IPStateInProgress
		case names[in.owner] != "":
			s.State = IPStateActive
		case in.owner == "":
			s.State = IPStateUnassigned
		default:
			s.State = IPStateNoMatch
		}
		if name := names[in.owner]; name != "" && in.known && s.NodeName == "" && s.ProviderID == in.owner {
			s.NodeName = name
		}
		st.IPs[ip] = s
	}
	for _, ip := range c.disabled {
		s := IPStatus{State: IPStateDisabled}
		if c.shared[ip] != "" {
			s.Error = "also listed by FloatingIPPool " + c.shared[ip]
		}
		st.IPs[ip] = s
	}
	for _, n := range c.needy(nodes) {
		if b := c.nodeRetry[n.ProviderID]; b != nil {
			st.NodeErrors = append(st.NodeErrors, n.Name)
			continue
		}
		st.AssignableNodes = append(st.AssignableNodes, n.Name)
	}
	sort.Strings(st.NodeErrors)
	return st
}
