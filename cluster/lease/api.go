// Package lease decides which node of a vipd cluster holds which address.
//
// It is a pure state machine built on go.etcd.io/raft/v3: no goroutines,
// sockets, files or clock reads. Time enters as now (a monotonic time from
// the caller) with every Step; the runtime (cluster/ and cmd/vipd) carries
// messages, persists state, delivers ticks at Output.Next and binds the
// addresses listed in Output.Holds until their lease ends.
//
// See docs/architecture.md ("Who holds what") for the protocol and the
// argument why two holders of one address never overlap.
package lease

import (
	"time"
)

// Role is what a node does in the cluster.
type Role int

const (
	// Voter votes and may hold addresses.
	Voter Role = iota
	// Witness votes and never holds (VIPD_ROLE=witness).
	Witness
)

// String returns "voter" or "witness".
func (r Role) String() string {
	switch r {
	case Voter:
		return "voter"
	case Witness:
		return "witness"
	}
	return "unknown"
}

// Kind says which kind of address an Address is; it decides the placement
// rule (control-plane addresses follow the leader, pool and egress addresses
// are spread over eligible nodes).
type Kind int

const (
	ControlPlane Kind = iota
	Pool
	Egress
)

// String returns "control-plane", "pool" or "egress".
func (k Kind) String() string {
	switch k {
	case ControlPlane:
		return "control-plane"
	case Pool:
		return "pool"
	case Egress:
		return "egress"
	}
	return "unknown"
}

// Address is one address the cluster must place on exactly one node.
type Address struct {
	Key  string // canonical prefix, e.g. "10.0.0.100/32", "fd00::100/128"
	Kind Kind
	// Restricted: only Nodes may hold it (none when Nodes is empty): an
	// IPPool's node selector, a Service's local traffic policy, an
	// EgressPolicy's nodeSelector. Pool and egress addresses only; the
	// leader places by its own Want.
	Restricted bool
	Nodes      []string
}

// allows reports whether node may hold a.
func (a Address) allows(node string) bool {
	if !a.Restricted {
		return true
	}
	for _, n := range a.Nodes {
		if n == node {
			return true
		}
	}
	return false
}

// Config is a node's configuration. Timings come from ProfileConfig; the
// rest from vipd's settings.
type Config struct {
	Name           string        // this node's name (unique in the cluster)
	Role           Role          // Voter or Witness
	Priority       int           // higher wins the control-plane addresses
	PreemptDelay   time.Duration // 0: no preemption
	Tick           time.Duration // raft tick length
	ElectionTicks  int           // raft ElectionTick; the lease L is derived from it
	HeartbeatTicks int           // lease renewals every HeartbeatTicks
	Drift          float64       // bound on the clock-rate difference between nodes, e.g. 0.01
	GrantFor       time.Duration // how long a grant to a non-leader holder lasts after its ack
	RemoveAfter    time.Duration // autopilot: a voter silent this long is removed ...
	MinVoters      int           // ... unless the voters would fall below this floor
	ExpectPeers    bool          // VIPD_PEERS configured: wait to discover before bootstrapping alone (see docs)
	Discover       time.Duration // with ExpectPeers: how long a node without state looks for a cluster before the lowest name bootstraps
	Incarnation    uint64        // the id of a node that starts without state, or whose state is of a configuration without it (the runtime draws it at random); 0: derived from Name and now
	VerifySettle   time.Duration // how long a report naming no holder must stand (unverified.go); 0: VerifySettle
	// Overlap bounds a planned transfer's make-before-break (transfer.go):
	// the old holder keeps an address at most this long (its own clock)
	// after it agreed to hand it over, or until the successor confirmed
	// it holds it. 0: break-before-make.
	Overlap time.Duration
}

// ProfileConfig returns the timings of a profile ("default", "fast"); an
// unknown profile returns the default timings. Name, Role, Priority,
// PreemptDelay and ExpectPeers are left for the caller.
func ProfileConfig(profile string) Config {
	switch profile {
	case "fast":
		return Config{
			Tick:           10 * time.Millisecond,
			ElectionTicks:  15,
			HeartbeatTicks: 5,
			Drift:          0.01,
			GrantFor:       2 * time.Second,
			RemoveAfter:    20 * time.Second,
			MinVoters:      3,
			Discover:       time.Second,
			Overlap:        150 * time.Millisecond,
		}
	default:
		return Config{
			Tick:           50 * time.Millisecond,
			ElectionTicks:  16,
			HeartbeatTicks: 7,
			Drift:          0.01,
			GrantFor:       5 * time.Second,
			RemoveAfter:    20 * time.Second,
			MinVoters:      3,
			Discover:       time.Second,
			Overlap:        300 * time.Millisecond,
		}
	}
}

// Event is an input to Machine.Step.
type Event interface{ isEvent() }

// Tick says time has advanced to now.
type Tick struct{}

// Receive is a message from another node's machine.
type Receive struct {
	From string
	Data []byte
}

// Health is this node's apiserver health (a witness never sends it).
type Health struct{ Healthy bool }

// Want lists every address the cluster must place (config VIPs + pool + egress).
type Want struct{ Addresses []Address }

// View is memberlist's view: discovery and failure hints, never decisions.
type View struct{ Members []Member }

// Member is one node in a View. Meta is what that node's Output.Meta published.
type Member struct {
	Name  string
	Alive bool
	Meta  []byte
	// Claims: addresses an old-protocol member (the previous release,
	// cluster/meta.go) claims in its metadata, decoded by the runtime. The
	// leader never grants them while that member is alive.
	Claims []string
}

// Transfer asks for a planned handover of what this node holds ("" = best successor).
type Transfer struct{ To string }

// Leave is a graceful stop: hand over, then leave the configuration.
type Leave struct{}

// Forget is `vipd forget NAME`: manual removal of a dead member.
type Forget struct{ Name string }

// Held is the runtime's report that it bound and announced these
// addresses (after an Output listed them in Holds). A successor in a
// planned transfer's overlap then tells the old holder to let go.
type Held struct{ Keys []string }

func (Tick) isEvent()     {}
func (Receive) isEvent()  {}
func (Health) isEvent()   {}
func (Want) isEvent()     {}
func (View) isEvent()     {}
func (Transfer) isEvent() {}
func (Leave) isEvent()    {}
func (Forget) isEvent()   {}
func (Held) isEvent()     {}

// Message is an envelope for another node's machine.
type Message struct {
	To   string
	Data []byte
}

// Output is what one Step asks of the runtime.
type Output struct {
	// Persist, when non-nil, must be written atomically (replace) BEFORE
	// Send is handed to the transport (raft's Ready rule).
	Persist []byte
	Send    []Message
	// Holds maps address Key -> lease end: this node may hold these now,
	// each until its end. An address absent here must be released NOW (the
	// runtime releases it at its end anyway), before Send is handed to the
	// transport: a vote or a transfer in Send may rely on the release.
	// Holds is complete on every Output.
	Holds map[string]time.Time
	// Meta, when non-nil, is published as this node's memberlist metadata
	// (cluster id, role, leader, term, voter set hash).
	Meta []byte
	// Next: call Step(Tick) at or before this time.
	Next time.Time
	// Notes: one per decision, for logs and metrics.
	Notes []Note
	// Overlaps lists the held addresses that are in a planned transfer's
	// agreed make-before-break overlap: the other node (With) may hold
	// the same address until Until (this node's clock). Complete on
	// every Output; the runtime counts it and its conflict guard does not
	// report With's MAC as a foreign holder meanwhile.
	Overlaps map[string]Overlap
}

// Overlap is one address's make-before-break window as one side knows it.
type Overlap struct {
	With  string    // the other holder: the successor (Old) or the old holder
	Old   bool      // this node is the old holder, releasing at Until at the latest
	Since time.Time // when this node learned of the overlap
	Until time.Time // the other side holds no longer than this (or this node, Old)
}

// Note is one decision, for logs (slog attributes) and metrics.
type Note struct {
	Msg   string
	Attrs []any
}

// Status is a snapshot of the machine for `vipd status`, metrics and tests.
type Status struct {
	Name       string
	ClusterID  uint64
	ID         uint64 // this node's raft id
	Leader     string // "" when unknown
	Term       uint64
	State      string // raft state: "StateLeader", "StateFollower", ...
	Voters     []string
	Learners   []string
	Witnesses  []string
	LeaseUntil time.Time         // leader lease end (zero if not leader / no lease)
	Holders    map[string]string // address key -> node (as this node knows it; authoritative on the leader)
	Holds      map[string]time.Time
	Quorum     bool // this node is leader with a valid lease, or follows a live leader
	Healthy    bool
	Leaving    bool
	Removed    bool // this node left the cluster (Leave completed); it holds nothing and stays inert

	// From: address key -> the node that let it go for its current holder
	// (a planned move: a handover, preemption, graceful leave or pool
	// rebalancing, not a failure), as this node knows it.
	From map[string]string
	// Unverified: nodes not eligible for an address now because most
	// others could not verify them, "address@node until" (unverified.go).
	Unverified []string
}
