package cloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"
)

// assignAPI is what a backend provides to the shared assign procedure:
// its three API calls, each through the shared caller.
type assignAPI interface {
	// Holder reads who holds the IP (and whether an action locks it, when
	// the provider shows that).
	Holder(ctx context.Context, ip netip.Addr) (Holding, error)
	// startAssign sends the assign and returns its action id, 0 when the
	// provider reports the move complete at once. A refusal because of
	// another action wraps ErrLocked (the provider says so) or ErrRefused
	// (it may be a lock: the holder's Locked field tells).
	startAssign(ctx context.Context, ip netip.Addr) (int64, error)
	// actionState polls one action.
	actionState(ctx context.Context, ip netip.Addr, id int64) (ActionState, string, error)
}

// assigner is the assign procedure every backend shares: resume our own
// action still running from an earlier, timed-out call instead of sending
// another; send the assign; poll its action; on an action that failed,
// assign again; on a refusal because another action holds the IP, wait it
// out (decideLock) and never undo a move that action made.
type assigner struct {
	title    string // "DigitalOcean"
	ipNoun   string // "reserved IP"
	instNoun string // "droplet"
	instance string
	poll     time.Duration
	lockWait time.Duration
	log      *slog.Logger
	pending  pendingActions
}

// lockStep is what to do after a refusal, given the holder now.
type lockStep int

const (
	lockWait    lockStep = iota // sleep lockWait, then look again
	lockDone                    // the IP ended up here: nothing to send
	lockMoved                   // the locking action moved it elsewhere: stop
	lockAssign                  // the lock is gone (or cannot be seen and we waited): assign again
	lockRefused                 // not a lock: the refusal is final
)

// decideLock is the pure rule. explicit: the provider called the refusal a
// lock (Hetzner's 423), so it is one even though the holder shows none;
// waited: we slept since the latest refusal; moved: the holder differs from
// the one seen at the first refusal of this assign.
func decideLock(h Holding, explicit, waited, moved bool) lockStep {
	switch {
	case h.Locked:
		return lockWait
	case h.Self:
		return lockDone
	case moved:
		return lockMoved
	case waited:
		return lockAssign
	case explicit:
		return lockWait
	default:
		return lockRefused
	}
}

// assign makes this instance the holder of ip.
func (a *assigner) assign(ctx context.Context, ip netip.Addr, api assignAPI) error {
	key := ip.String()
	first, before := true, "" // the holder at the first refusal
	for {
		if id := a.pending.get(key); id != 0 {
			err := a.wait(ctx, ip, id, api)
			if err == nil {
				a.pending.set(key, 0)
				return nil
			}
			if !errors.Is(err, ErrActionFailed) && !errors.Is(err, ErrNotFound) {
				return err // ctx ended or the API is down: resume next time
			}
			a.pending.set(key, 0)
			a.log.Warn("assign action failed; assigning again", "ip", ip, "action", id, "err", err)
			if err := sleep(ctx, a.lockWait); err != nil {
				return fmt.Errorf("%s %s: %w (%w)", a.ipNoun, ip, err, ErrActionFailed)
			}
		}
		id, err := api.startAssign(ctx, ip)
		switch {
		case errors.Is(err, ErrLocked) || errors.Is(err, ErrRefused):
			explicit, waited := errors.Is(err, ErrLocked), false
			for again := false; !again; {
				h, herr := api.Holder(ctx, ip)
				if herr != nil {
					if ctx.Err() != nil && !first {
						return fmt.Errorf("%s %s is still locked by another action: %w (%w)", a.ipNoun, ip, ctx.Err(), err)
					}
					return herr
				}
				if first {
					first, before = false, h.Holder
					if h.Locked || explicit {
						a.log.Info(a.ipNoun+" locked by another action in progress; waiting to retry the assign", "ip", ip, "holder", h.Holder)
					}
				}
				switch decideLock(h, explicit, waited, h.Holder != before) {
				case lockDone:
					return nil
				case lockMoved:
					return fmt.Errorf("%s %s was moved to %s %s by the action that held its lock; not moving it back at once: %w", a.ipNoun, ip, a.instNoun, h.Holder, err)
				case lockRefused:
					return fmt.Errorf("%s refused to assign %s %s to %s %s (held by %q): %w", a.title, a.ipNoun, ip, a.instNoun, a.instance, h.Holder, err)
				case lockAssign:
					again = true
				case lockWait:
					if serr := sleep(ctx, a.lockWait); serr != nil {
						return fmt.Errorf("%s %s is still locked by another action: %w (%w)", a.ipNoun, ip, serr, err)
					}
					waited = true
				}
			}
			continue
		case err != nil:
			return fmt.Errorf("assign %s %s to %s %s: %w", a.ipNoun, ip, a.instNoun, a.instance, err)
		}
		if id == 0 {
			return nil
		}
		a.log.Info("assign action started", "ip", ip, "action", id)
		a.pending.set(key, id)
	}
}

// wait polls one of our actions until it completes.
func (a *assigner) wait(ctx context.Context, ip netip.Addr, id int64, api assignAPI) error {
	what := fmt.Sprintf("assign action %d for %s %s", id, a.ipNoun, ip)
	return pollAction(ctx, a.poll, what, func(ctx context.Context) (ActionState, string, error) {
		return api.actionState(ctx, ip, id)
	})
}
