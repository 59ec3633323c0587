// Package cloud moves a cloud provider's reserved (floating) IP to the node
// that vipd elected, and exposes that as a vip.Announcer for cloud mode.
//
// The Announcer owns the small Provider interface (who holds an IP, assign
// it here) and the optional LocalChecker and AddressDeliverer traits. Two
// backends implement it: DigitalOcean reserved IPs through
// github.com/digitalocean/godo (/v2/reserved_ips and its actions, never the
// deprecated floating_ips endpoints) and Hetzner Cloud floating IPs through
// github.com/hetznercloud/hcloud-go/v2. A move is always an assign by the
// new holder: vipd never unassigns, so a released IP keeps routing to the
// old instance until someone else takes it, exactly like FLIPOP.
//
// What the backends share is written once: caller (every HTTP request goes
// through one gate per client that honours 429 waits and backs off after
// 5xx and transport errors, counted in vipd_cloud_calls_total and timed in
// vipd_cloud_call_duration_seconds, with a token-file reload after a 401),
// assigner (resume our own pending action, send the assign, poll the
// action, wait out another action's lock by the pure decideLock rule), and
// metadataGet. A third provider is its SDK calls (Holder, startAssign,
// actionState), its error words for caller, and a constructor.
package cloud

import (
	"context"
	"errors"
	"net/netip"
)

// Holding is what the provider says about a reserved IP.
type Holding struct {
	// Holder is the provider's id of the instance the IP is assigned to,
	// empty when it is unassigned.
	Holder string
	// Self is true when Holder is this instance.
	Self bool
	// Locked is true while an action on the IP is in progress.
	Locked bool
}

// Provider assigns reserved IPs to this instance and reports who holds
// them. Implementations are safe for concurrent use.
type Provider interface {
	// Name is the provider's label in metrics and logs ("digitalocean").
	Name() string
	// Instance is this instance's provider id (the droplet id).
	Instance() string
	// Holder asks the provider API who holds ip now.
	Holder(ctx context.Context, ip netip.Addr) (Holding, error)
	// Assign makes this instance the holder of ip and returns once the
	// provider reports the move complete, or when ctx ends. Assigning an IP
	// this instance already holds is allowed (no-op or a harmless action).
	Assign(ctx context.Context, ip netip.Addr) error
}

// LocalChecker is implemented by providers that can tell from the
// instance itself (a metadata service, no API quota) whether it holds ip.
type LocalChecker interface {
	HeldLocally(ctx context.Context, ip netip.Addr) (bool, error)
}

// Errors callers can test with errors.Is. The wrapped messages carry the
// provider's own words and what to do.
var (
	// ErrUnauthorized: the API rejected the token (401) or the token lacks
	// a scope (403). Retrying does not help.
	ErrUnauthorized = errors.New("API token rejected")
	// ErrNotFound: the reserved IP (or droplet) does not exist in the
	// account the token belongs to.
	ErrNotFound = errors.New("not found")
	// ErrRefused: the API refused the request (422) for a reason other
	// than a lock, e.g. the droplet already has another reserved IP.
	ErrRefused = errors.New("request refused")
	// ErrLocked: the provider refused the action because another action
	// on the IP is running (Hetzner's 423 "locked").
	ErrLocked = errors.New("locked by another action")
	// ErrRateLimited: the call was not sent because the API asked us to
	// wait (429) until after the caller's deadline.
	ErrRateLimited = errors.New("rate limited")
	// ErrUnavailable: the API failed (5xx, transport error) and the caller's
	// deadline came before a retry could succeed.
	ErrUnavailable = errors.New("API unavailable")
	// ErrActionFailed: the provider reported the assign action errored.
	ErrActionFailed = errors.New("action failed")
	// ErrCoolOff: the announcer refused to assign again so soon after its
	// last assign (see AnnouncerOptions.CoolOff).
	ErrCoolOff = errors.New("assign cool-off")
)

// SettingError is a configuration problem found by a backend (a missing
// token, an unreadable token file): the daemon should exit with its
// configuration exit code and print it as one line.
type SettingError struct {
	Name     string // the environment variable
	Value    string
	Accepted string
	Err      error
}

func (e *SettingError) Error() string {
	msg := "invalid " + e.Name + "=" + quote(e.Value) + ": want " + e.Accepted
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	return msg
}

func (e *SettingError) Unwrap() error { return e.Err }

func quote(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	b = append(b, s...)
	return string(append(b, '"'))
}
