package vip

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Re-subscription back-off after the watch is lost; a subscription that
// lasted watchStable starts again from watchRetryMin.
const (
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = 5 * time.Second
	watchStable   = 10 * time.Second
)

var _ Watcher = (*L2)(nil)

// Watch reports changes of the VIP interface and its addresses
// (vip.Watcher) from netlink notifications in the process's network
// namespace: the interface (by its index or its name) renamed, removed,
// created, going down or up, losing or regaining its carrier; an address
// added to it or removed from it (a VIP deleted by another program). Changes
// on other interfaces are not reported.
//
// When a subscription fails or its socket errs (ENOBUFS: notifications
// were dropped), the watch reports Live false, logs it once and subscribes
// again with back-off; Live true again once it is back. The conflict guard
// (l2guard.go) reads the wire, and the verification (l2verify.go) runs its
// rounds, for as long as the watch runs. Every goroutine
// stops, and the channel is closed, after ctx is done.
func (l *L2) Watch(ctx context.Context) <-chan WatchEvent {
	out := make(chan WatchEvent, 1)
	guard, verify := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(guard)
		l.runGuard(ctx)
	}()
	go func() {
		defer close(verify)
		l.runVerify(ctx)
	}()
	go func() {
		defer close(out)
		l.watch(ctx, out)
		<-guard
		<-verify
	}()
	return out
}

// notify sends ev, replacing one still pending: the receiver only needs
// the latest. It never blocks as long as the caller is the only sender.
func notify(out chan WatchEvent, ev WatchEvent) {
	select {
	case <-out:
	default:
	}
	out <- ev
}

func (l *L2) watch(ctx context.Context, out chan WatchEvent) {
	backoff := watchRetryMin
	failing := false // a failure streak is logged once, at its start
	for {
		var since time.Time
		err := l.watchOnce(ctx, out, func() {
			since = time.Now()
			if failing {
				l.log.Info("netlink watch of the VIP interface is back", "interface", l.ifname)
				failing = false
			}
			notify(out, WatchEvent{Live: true})
		})
		if ctx.Err() != nil {
			return
		}
		if !since.IsZero() && time.Since(since) >= watchStable {
			backoff = watchRetryMin
		}
		if !failing {
			l.log.Warn("netlink watch of the VIP interface lost: polling every second until it is back", "interface", l.ifname, "retry_in", backoff, "err", err)
			failing = true
		} else {
			l.log.Debug("netlink watch of the VIP interface still failing", "interface", l.ifname, "retry_in", backoff, "err", err)
		}
		notify(out, WatchEvent{Live: false})
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, watchRetryMax)
	}
}

// linkKey is what matters of a link for the VIPs on it.
type linkKey struct {
	name string
	down string // linkDownReason
}

// watchOnce subscribes to link and address notifications and reports the
// relevant ones until ctx is done (nil) or a subscription is lost (its
// error). up is called once both subscriptions are established. Both
// subscriptions' goroutines have stopped when it returns.
func (l *L2) watchOnce(ctx context.Context, out chan WatchEvent, up func()) (err error) {
	done := make(chan struct{})
	links := make(chan netlink.LinkUpdate, 16)
	addrs := make(chan netlink.AddrUpdate, 16)
	var mu sync.Mutex
	var last error // the last error the subscriptions reported
	hint := make(chan struct{}, 1)
	onErr := func(err error) {
		mu.Lock()
		last = err
		mu.Unlock()
		select {
		case hint <- struct{}{}:
		default:
		}
	}
	lastErr := func() error {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
	var linkOn, addrOn bool
	defer func() {
		// Closing done closes the sockets; each subscription's goroutine
		// then closes its channel (it may be blocked sending on it).
		close(done)
		lc, ac := links, addrs
		if !linkOn {
			lc = nil
		}
		if !addrOn {
			ac = nil
		}
		for lc != nil || ac != nil {
			select {
			case _, ok := <-lc:
				if !ok {
					lc = nil
				}
			case _, ok := <-ac:
				if !ok {
					ac = nil
				}
			}
		}
	}()
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: l.watchRcvBuf}); err != nil {
		return fmt.Errorf("subscribe to link notifications: %w", err)
	}
	linkOn = true
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: l.watchRcvBuf}); err != nil {
		return fmt.Errorf("subscribe to address notifications: %w", err)
	}
	addrOn = true
	// What the interface looks like now; the first change is measured
	// against it. Changes before the subscription are found by the
	// reconcile Live true asks for.
	seen := map[int]linkKey{}
	if link, _ := l.lookup(); link != nil {
		seen[link.Attrs().Index] = linkKey{link.Attrs().Name, linkDownReason(link.Attrs())}
	}
	// Changes before the subscription were not seen; from now on every
	// link change marks the set of this host's MACs stale.
	l.macs.watching(true)
	defer l.macs.watching(false)
	up()
	lost := func(what string) error {
		if err := lastErr(); err != nil {
			return fmt.Errorf("%s notifications: %w", what, err)
		}
		return fmt.Errorf("%s notifications: subscription closed", what)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-links:
			if !ok {
				linkOn = false
				return lost("link")
			}
			// Any link's MAC may have changed (a NIC added, a bond's
			// address moved): the set of this host's MACs is read again.
			l.macs.invalidate()
			if l.linkChanged(u, seen) {
				notify(out, WatchEvent{Live: true})
			}
		case u, ok := <-addrs:
			if !ok {
				addrOn = false
				return lost("address")
			}
			if u.LinkIndex == int(l.index.Load()) {
				notify(out, WatchEvent{Live: true})
			}
		case <-l.poke:
			// The verification found that the others cannot reach a
			// held VIP: have it checked now.
			notify(out, WatchEvent{Live: true})
		case <-hint:
			// A notification could not be read (or the socket failed, and
			// its channel closes next): something may have been missed.
			l.macs.invalidate()
			if err := lastErr(); err != nil {
				l.log.Debug("netlink watch: a notification could not be read", "interface", l.ifname, "err", err)
			}
			notify(out, WatchEvent{Live: true})
		}
	}
}

// linkChanged reports whether u changes what matters about the VIP
// interface (known by its last index or by its name): its name, whether
// it can carry a VIP, or its existence. seen holds the last state per index.
func (l *L2) linkChanged(u netlink.LinkUpdate, seen map[int]linkKey) bool {
	a := u.Attrs()
	if a == nil || a.Index != int(l.index.Load()) && a.Name != l.ifname {
		return false
	}
	if u.Header.Type == unix.RTM_DELLINK {
		delete(seen, a.Index)
		return true
	}
	if a.Name == l.ifname {
		// Created again under its name (a new index): its addresses are
		// watched from now on.
		l.index.Store(int32(a.Index))
	}
	k := linkKey{a.Name, linkDownReason(a)}
	if old, ok := seen[a.Index]; ok && old == k {
		return false
	}
	seen[a.Index] = k
	return true
}
