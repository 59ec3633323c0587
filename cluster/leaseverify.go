package cluster

import (
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/vipd/vipd/cluster/lease"
)

// LeaseVerify carries the l2 verification's verdicts (issue 27) over the
// lease election: this node's reports go into the lease machine, which
// publishes them in its metadata (at most lease.MaxReports, only
// failures) and, on the leader, makes a holder most others cannot verify
// ineligible for the address (cluster/lease/unverified.go); the holder
// reads the reports about itself from the members' metadata.
type LeaseVerify struct {
	n  *LeaseNode
	mu sync.Mutex
	// reports: the addresses this node cannot reach, to the holder it
	// believes in.
	reports map[string]string
	pending bool // the last set was dropped (the election's queue was full)
}

// NewLeaseVerify returns the verification's view of n.
func NewLeaseVerify(n *LeaseNode) *LeaseVerify {
	return &LeaseVerify{n: n, reports: map[string]string{}}
}

// SetUnverified publishes whether this node can reach vip through holder
// ("" when it does not know who holds it: pool and egress addresses).
func (v *LeaseVerify) SetUnverified(vip, holder string, unreachable bool) {
	v.mu.Lock()
	if unreachable {
		v.reports[vip] = holder
	} else {
		delete(v.reports, vip)
	}
	v.mu.Unlock()
	v.post()
}

// Resync posts the reports again if the last post was dropped (the
// verification calls it every round): a withdrawal must never be lost, or
// a stale report would count against the next holder.
func (v *LeaseVerify) Resync() {
	v.mu.Lock()
	pending := v.pending
	v.mu.Unlock()
	if pending {
		v.post()
	}
}

// post hands the full set to the machine.
func (v *LeaseVerify) post() {
	v.mu.Lock()
	defer v.mu.Unlock()
	rs := make([]lease.Report, 0, len(v.reports))
	for k, h := range v.reports {
		rs = append(rs, lease.Report{Key: k, Holder: h})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].Key < rs[j].Key })
	v.pending = !v.n.loop.post(lease.Unreachable{Reports: rs})
}

// memberReports is a member's metadata reports as lease.ReportsOf decodes
// them: kept per member and decoded when its metadata changes, not at each
// of the verification's reads (every 400 ms).
type memberReports struct {
	rs      []lease.Report
	witness bool
	ok      bool
}

// UnverifiedBy returns the alive members other than this node that report
// they cannot reach vip through this node (or through its holder, not
// named: pool and egress addresses), and how many alive members other
// than this node verify (witnesses do not).
func (v *LeaseVerify) UnverifiedBy(vip string) (reporters []string, others int) {
	self := v.n.cfg.Cluster.Name
	v.n.mu.Lock()
	defer v.n.mu.Unlock()
	for name, m := range v.n.members {
		if !m.Alive || name == self {
			continue
		}
		r := v.n.reports[name]
		if !r.ok || r.witness {
			continue
		}
		others++
		rs := r.rs
		if slices.Contains(rs, lease.Report{Key: vip, Holder: self}) || slices.Contains(rs, lease.Report{Key: vip}) {
			reporters = append(reporters, name)
		}
	}
	sort.Strings(reporters)
	return reporters, others
}

// MemberAddr returns the gossip IP address of the named member.
func (v *LeaseVerify) MemberAddr(name string) (netip.Addr, bool) {
	v.n.mu.Lock()
	a := v.n.addrs[name]
	v.n.mu.Unlock()
	ap, err := netip.ParseAddrPort(a)
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// Exclusions lists, for /status, the nodes the lease election keeps from
// an address because most others could not verify them there, as this
// node's machine knows them ("address@node until").
func (v *LeaseVerify) Exclusions() []string {
	st, _, _ := v.n.loop.snapshot()
	if st.Unverified == nil {
		return []string{}
	}
	return st.Unverified
}

// Excluded reports whether the lease election keeps this node from vip
// because most others could not verify it there (this node's machine
// counts the reports on itself): why the election moved it away.
func (v *LeaseVerify) Excluded(vip string) bool {
	st, _, _ := v.n.loop.snapshot()
	prefix := vip + "@" + v.n.cfg.Cluster.Name + " "
	for _, e := range st.Unverified {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}

// Reported returns, by address, the alive members other than this node
// that report it unreachable through this node or through a holder not
// named, and how many alive members other than this node verify: one
// pass over the members' metadata (at most lease.MaxReports each) that
// the verification keeps between rounds, so that a holder the election
// moved still knows who reported it after the reports were withdrawn.
func (v *LeaseVerify) Reported() (map[string][]string, int) {
	self := v.n.cfg.Cluster.Name
	out := map[string][]string{}
	others := 0
	v.n.mu.Lock()
	defer v.n.mu.Unlock()
	for _, name := range sortedKeys(v.n.members) {
		m := v.n.members[name]
		if !m.Alive || name == self {
			continue
		}
		mr := v.n.reports[name]
		if !mr.ok || mr.witness {
			continue
		}
		others++
		for _, r := range mr.rs {
			if r.Holder == self || r.Holder == "" {
				out[r.Key] = append(out[r.Key], name)
			}
		}
	}
	return out, others
}
