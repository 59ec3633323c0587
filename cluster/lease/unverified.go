package lease

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Unverified holders (issue 27). Every node that does not hold an address
// resolves it now and then on the wire (vip/conflict's Verifier); when it
// cannot, it reports the address and the holder it believes in through
// its metadata (Unreachable -> meta "u"). The leader reads every live
// member's reports from the View: a node reported by a majority of the
// other live nodes for an address it is assigned is not eligible for that
// address for a bounded time, when another eligible node exists, so the
// address moves to a node whose announcements the others can verify.
//
// Every machine counts the reports that name its own node too, and keeps
// its own exclusions in its metadata (meta "x"): the control-plane
// addresses follow the leader, so the node they leave is usually the
// leader that excluded itself; the next leader reads the exclusion there.
//
// Only failures travel, at most MaxReports per node (the metadata is
// memberlist's 512 bytes). A report names the holder, so a report about
// the previous holder never counts against the next one. Each new
// exclusion of the same node for the same address doubles its length
// (UnverifiedFor, 2x, 4x ... up to UnverifiedMax); strikes are forgotten
// after UnverifiedMemory without one: a node whose port stays filtered
// gets the address back at most once per UnverifiedMax, never flaps.

const (
	// MaxReports bounds the reports a node publishes (the metadata limit,
	// also reportBytes): more unreachable addresses than this are reported
	// MaxReports at a time, the ones first in order; the rest once those
	// moved.
	MaxReports = 8
	// reportBytes bounds the reports' share of the metadata (the rest,
	// ~150 bytes, is the machine's own): eight IPv4 reports fit, fewer
	// long IPv6 ones.
	reportBytes = 320
	// UnverifiedFor is the first exclusion of a node for an address.
	UnverifiedFor = 30 * time.Second
	// UnverifiedMax bounds an exclusion.
	UnverifiedMax = 10 * time.Minute
	// UnverifiedMemory: strikes older than this are forgotten.
	UnverifiedMemory = 30 * time.Minute
	// VerifySettle is Config.VerifySettle's default: three verification
	// rounds of one second.
	VerifySettle = 3 * time.Second
)

// Report is one address this node cannot reach through the node it
// believes holds it.
type Report struct {
	Key string // the address key
	// Holder: the node this node believes holds it; "" when it does not
	// know (pool and egress addresses: a node knows only its own holds).
	// Such a report counts against whoever holds the address once it has
	// held it, and the report has stood, for VerifySettle: by then a
	// reporter has verified a new holder and withdrawn a report about
	// the previous one.
	Holder string
}

// Unreachable replaces this node's reports (the verification's verdicts):
// every address it cannot reach now, through whom.
type Unreachable struct{ Reports []Report }

func (Unreachable) isEvent() {}

// unverifiedState is the exclusion bookkeeping of one machine. It lives on
// the Machine (not the leader's term state): strikes outlast a change of
// leader on the node that counted them.
type unverifiedState struct {
	own     []Report
	until   map[exclKey]time.Time // excluded until
	strikes map[exclKey]strike
	sig     string // of the exclusions in force, for place's signature
	// For reports that name no holder: since when each address has had
	// its holder, and since when each reporter's report has stood.
	heldSince map[string]heldSince
	seen      map[exclKey]time.Time // {key, reporter}
}

// quiet: no report of this node or in any member's metadata, and no
// exclusion, strike or settling report remembered.
func (u *unverifiedState) quiet(view map[string]meta) bool {
	if len(u.own) > 0 || len(u.until) > 0 || len(u.strikes) > 0 || len(u.seen) > 0 || len(u.heldSince) > 0 {
		return false
	}
	for _, md := range view {
		if len(md.Unreach) > 0 || len(md.Excl) > 0 {
			return false
		}
	}
	return true
}

type heldSince struct {
	node  string
	since time.Time
}

type exclKey struct{ key, node string }

type strike struct {
	n    int
	last time.Time
}

// setReports stores this node's reports (published in its metadata),
// sorted and capped at MaxReports; nothing else changes.
func (m *Machine) setReports(rs []Report) {
	own := make([]Report, 0, len(rs))
	for _, r := range rs {
		if r.Key != "" && r.Holder != m.cfg.Name && !strings.Contains(r.Key, " ") && !strings.Contains(r.Holder, " ") {
			own = append(own, r)
		}
	}
	sort.Slice(own, func(i, j int) bool {
		if own[i].Key != own[j].Key {
			return own[i].Key < own[j].Key
		}
		return own[i].Holder < own[j].Holder
	})
	own = slices.Compact(own)
	if len(own) > MaxReports {
		own = own[:MaxReports]
	}
	m.unv.own = own
}

// reportsMeta encodes this node's reports for its metadata ("key holder").
func (m *Machine) reportsMeta() []string {
	if len(m.unv.own) == 0 {
		return nil
	}
	var out []string
	size := 0
	for _, r := range m.unv.own {
		s := r.Key
		if r.Holder != "" {
			s += " " + r.Holder
		}
		if size += len(s) + 3; size > reportBytes {
			break
		}
		out = append(out, s)
	}
	return out
}

func decodeReports(ss []string) []Report {
	var out []Report
	for _, s := range ss {
		k, h, named := strings.Cut(s, " ")
		if k != "" && (!named || h != "") {
			out = append(out, Report{Key: k, Holder: h})
		}
		if len(out) == MaxReports {
			break
		}
	}
	return out
}

// ReportsOf decodes the reports in a member's metadata (Member.Meta); ok
// is false for metadata that is not this machine's, witness says whether
// that member is a witness (it never verifies).
func ReportsOf(meta []byte) (rs []Report, witness, ok bool) {
	md, ok := parseMeta(meta)
	if !ok {
		return nil, false, false
	}
	return decodeReports(md.Unreach), md.Role == Witness, true
}

// exclMeta lists the addresses this node is excluded from now, for its
// metadata (at most MaxReports).
func (m *Machine) exclMeta() []string {
	var out []string
	for _, k := range sortedExcl(m.unv.until) {
		if k.node == m.cfg.Name && m.now.Before(m.unv.until[k]) && len(out) < MaxReports {
			out = append(out, k.key)
		}
	}
	return out
}

// updateUnverified (every Step) turns the live members' reports into
// exclusions: an address's holder that a majority of the other live
// verifying nodes report is excluded from it. The leader counts reports
// on the holder it assigned; every node counts those on itself.
func (m *Machine) updateUnverified() {
	if m.unv.until == nil {
		m.unv.until = map[exclKey]time.Time{}
		m.unv.strikes = map[exclKey]strike{}
		m.unv.heldSince = map[string]heldSince{}
		m.unv.seen = map[exclKey]time.Time{}
	}
	for k, until := range m.unv.until {
		if !m.now.Before(until) {
			delete(m.unv.until, k)
		}
	}
	for k, s := range m.unv.strikes {
		if m.now.Sub(s.last) >= UnverifiedMemory {
			delete(m.unv.strikes, k)
		}
	}
	if m.unv.quiet(m.viewMeta) {
		// Nobody reports anything and nothing is remembered: the pass
		// below would find nothing (every step of an idle cluster).
		m.unv.sig = ""
		return
	}
	// Who verifies: live non-witness members (this node included) and
	// what each reports.
	verifiers := map[string][]Report{}
	if m.cfg.Role == Voter {
		verifiers[m.cfg.Name] = m.unv.own
	}
	for name, md := range m.viewMeta {
		if md.Alive && md.Role != Witness {
			verifiers[name] = decodeReports(md.Unreach)
		}
	}
	settle := m.cfg.VerifySettle
	if settle <= 0 {
		settle = VerifySettle
	}
	seen := map[exclKey]bool{}
	reporters := map[exclKey][]string{}
	for name, rs := range verifiers {
		for _, r := range rs {
			holder := r.Holder
			if holder == "" {
				// Whoever holds it, once it and the report have settled.
				holder = m.holderOf(r.Key)
				sk := exclKey{r.Key, name}
				seen[sk] = true
				if _, ok := m.unv.seen[sk]; !ok {
					m.unv.seen[sk] = m.now
				}
				hs, ok := m.unv.heldSince[r.Key]
				if holder == "" || !ok || hs.node != holder || m.now.Sub(hs.since) < settle || m.now.Sub(m.unv.seen[sk]) < settle {
					continue
				}
			}
			assigned := m.lead != nil && m.lead.assign[r.Key] == holder
			if (assigned || holder == m.cfg.Name) && holder != name {
				k := exclKey{r.Key, holder}
				reporters[k] = append(reporters[k], name)
			}
		}
	}
	for k := range m.unv.seen {
		if !seen[k] {
			delete(m.unv.seen, k)
		}
	}
	for key := range m.unv.heldSince {
		reported := false
		for k := range m.unv.seen {
			if k.key == key {
				reported = true
				break
			}
		}
		if !reported {
			delete(m.unv.heldSince, key)
		}
	}
	for _, k := range sortedExcl(reporters) {
		others := len(verifiers)
		if _, in := verifiers[k.node]; in {
			others--
		}
		rep := reporters[k]
		if others == 0 || 2*len(rep) <= others {
			continue
		}
		if _, already := m.unv.until[k]; already {
			continue
		}
		s := m.unv.strikes[k]
		s.n++
		s.last = m.now
		m.unv.strikes[k] = s
		d := UnverifiedFor
		for i := 1; i < s.n && d < UnverifiedMax; i++ {
			d *= 2
		}
		d = min(d, UnverifiedMax)
		m.unv.until[k] = m.now.Add(d)
		sort.Strings(rep)
		m.note("address unverified: most other nodes cannot reach it through its holder; that node is not eligible for it for a while",
			"address", k.key, "node", k.node, "reporters", strings.Join(rep, ","), "for", d)
	}
	var parts []string
	for _, k := range sortedExcl(m.unv.until) {
		parts = append(parts, k.key+"@"+k.node)
	}
	for _, name := range sortedKeys(m.viewMeta) {
		for _, k := range m.viewMeta[name].Excl {
			parts = append(parts, k+"@"+name+"(own)")
		}
	}
	m.unv.sig = strings.Join(parts, ",")
}

// holderOf is who holds key as this machine knows it: the leader's
// assignment, or this node for what it holds. It notes when that holder
// got it (heldSince) for the reports that name no holder.
func (m *Machine) holderOf(key string) string {
	h := ""
	if m.lead != nil {
		h = m.lead.assign[key]
	} else if m.hold.keys[key] {
		h = m.cfg.Name
	}
	if hs, ok := m.unv.heldSince[key]; !ok || hs.node != h {
		if h == "" {
			delete(m.unv.heldSince, key)
		} else {
			m.unv.heldSince[key] = heldSince{node: h, since: m.now}
		}
	}
	return h
}

// unverifiedFilter drops from cands the nodes excluded for key, unless
// that leaves none (an unverified holder is better than none).
func (m *Machine) unverifiedFilter(key string, cands []string) []string {
	if m.unv.sig == "" {
		return cands
	}
	var out []string
	for _, n := range cands {
		if !m.unverifiedExcluded(key, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return cands
	}
	return out
}

// unverifiedCP is unverifiedFilter for the control-plane addresses, which
// move together: a node excluded for any of them is dropped.
func (m *Machine) unverifiedCP(cands []string) []string {
	if m.unv.sig == "" {
		return cands
	}
	for _, a := range m.want {
		if a.Kind == ControlPlane {
			cands = m.unverifiedFilter(a.Key, cands)
		}
	}
	return cands
}

// unverifiedExcluded: node is excluded from key by this machine's count,
// or says so itself in its metadata.
func (m *Machine) unverifiedExcluded(key, node string) bool {
	if until, ok := m.unv.until[exclKey{key, node}]; ok && m.now.Before(until) {
		return true
	}
	if md, ok := m.viewMeta[node]; ok && md.Alive && node != m.cfg.Name {
		return slices.Contains(md.Excl, key)
	}
	return false
}

// UnverifiedStatus lists the exclusions in force, "address@node until".
func (m *Machine) UnverifiedStatus() []string {
	var out []string
	for _, k := range sortedExcl(m.unv.until) {
		if until := m.unv.until[k]; m.now.Before(until) {
			out = append(out, fmt.Sprintf("%s@%s until %s", k.key, k.node, until.Format(time.RFC3339)))
		}
	}
	return out
}

func sortedExcl[V any](mp map[exclKey]V) []exclKey {
	if len(mp) == 0 {
		return nil // every step of an idle cluster: no sort.Slice garbage
	}
	ks := make([]exclKey, 0, len(mp))
	for k := range mp {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].key != ks[j].key {
			return ks[i].key < ks[j].key
		}
		return ks[i].node < ks[j].node
	})
	return ks
}
