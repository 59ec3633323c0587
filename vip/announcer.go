package vip

import (
	"context"
	"net/netip"
	"time"
)

// Announcer makes this node answer, or stop answering, for a VIP. Each mode
// (l2, bgp, cloud) is one Announcer; who should announce is decided by the
// core, never by the announcer. Every method must be idempotent: the driver
// calls them again on every reconcile pass.
type Announcer interface {
	// Acquire makes the VIP reachable through this node: bind it on the
	// interface (l2), advertise it (bgp), assign it to this instance (cloud).
	Acquire(ctx context.Context, vip netip.Prefix) error
	// Release undoes Acquire. Releasing a VIP that is not held is not an error.
	Release(ctx context.Context, vip netip.Prefix) error
	// Announce repeats the announcement of a held VIP (gratuitous ARP /
	// unsolicited NA in l2). Modes without such a thing return nil.
	Announce(ctx context.Context, vip netip.Prefix) error
	// Present reports what the outside world (kernel, router, cloud) says
	// now: whether this node currently answers for the VIP. The driver uses it
	// to reconcile; it must be cheap (cached where it costs an API call).
	Present(ctx context.Context, vip netip.Prefix) (bool, error)
	// Close releases resources (sockets, sessions). It does not release VIPs.
	Close() error
}

// Checker is implemented by announcers that can tell whether a VIP this node
// holds still works. The driver calls Check for every held VIP on each reconcile.
type Checker interface {
	// Check returns nil while the held VIP works; an error wrapping ErrLinkDown
	// when its interface is down or gone; a *ConflictError when probe is true
	// and another MAC answers for the VIP (an ARP request / neighbour
	// solicitation sent from this node while it holds the VIP: replies from any
	// MAC other than ours are a conflict).
	Check(ctx context.Context, vip netip.Prefix, probe bool) error
}

// LoneAcquirer is implemented by announcers without a data-plane probe
// (cloud). The driver calls AcquireLone instead of Acquire while this node
// holds by bootstrapping alone in a cluster (peers configured, none
// reached): it must not take a VIP that another node holds.
type LoneAcquirer interface {
	AcquireLone(ctx context.Context, vip netip.Prefix) error
}

// DefaultActionTimeout bounds one action of an announcer that does not
// say otherwise (SlowActions).
const DefaultActionTimeout = 5 * time.Second

// SlowActions is implemented by announcers whose actions may take longer
// than DefaultActionTimeout (cloud: an assign includes polling the API);
// the driver bounds each of their actions by ActionTimeout instead.
type SlowActions interface {
	ActionTimeout() time.Duration
}

// HandoverAcquirer is implemented by announcers that hold back an
// ordinary Acquire where a planned handover needs no such care. The driver
// calls AcquireHandover instead of Acquire when the previous holder
// released the VIP for this node moments ago: nobody else answers for it,
// so l2 skips its pre-bind conflict probe, and cloud its cool-off between
// two assigns (a handover is no flapping election).
type HandoverAcquirer interface {
	AcquireHandover(ctx context.Context, vip netip.Prefix) error
}
