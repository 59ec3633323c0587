package lab

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Sample is the set of nodes holding a VIP from At on.
type Sample struct {
	At      time.Time
	Holders []string
}

// Monitor samples which nodes have a VIP bound, every 10 ms, through
// netlink handles opened in each node namespace (no process per sample).
type Monitor struct {
	vip     netip.Addr
	mu      sync.Mutex
	samples []Sample // only changes are kept
	stop    chan struct{}
	done    chan struct{}
}

// Monitor starts watching vip on every node of the lab.
func (l *Lab) Monitor(vip netip.Addr) (*Monitor, error) {
	type handle struct {
		name string
		h    *netlink.Handle
		link netlink.Link
	}
	var hs []handle
	for _, n := range l.Nodes {
		ns, err := netns.GetFromName(n.NS)
		if err != nil {
			return nil, err
		}
		h, err := netlink.NewHandleAt(ns)
		ns.Close()
		if err != nil {
			return nil, fmt.Errorf("netlink in %s: %w", n.NS, err)
		}
		link, err := h.LinkByName(n.Link)
		if err != nil {
			return nil, err
		}
		hs = append(hs, handle{n.Name, h, link})
	}
	m := &Monitor{vip: vip, stop: make(chan struct{}), done: make(chan struct{})}
	family := netlink.FAMILY_V4
	if vip.Is6() {
		family = netlink.FAMILY_V6
	}
	go func() {
		defer close(m.done)
		defer func() {
			for _, h := range hs {
				h.h.Close()
			}
		}()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			var holders []string
			for _, h := range hs {
				addrs, err := h.h.AddrList(h.link, family)
				if err != nil {
					continue
				}
				for _, a := range addrs {
					if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == vip {
						holders = append(holders, h.name)
					}
				}
			}
			sort.Strings(holders)
			m.record(time.Now(), holders)
			select {
			case <-m.stop:
				return
			case <-t.C:
			}
		}
	}()
	l.OnClose(m.Stop)
	return m, nil
}

func (m *Monitor) record(at time.Time, holders []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.samples); n > 0 && strings.Join(m.samples[n-1].Holders, ",") == strings.Join(holders, ",") {
		return
	}
	m.samples = append(m.samples, Sample{At: at, Holders: holders})
}

// Stop ends sampling.
func (m *Monitor) Stop() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
}

// Now returns the current holders.
func (m *Monitor) Now() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.samples) == 0 {
		return nil
	}
	return m.samples[len(m.samples)-1].Holders
}

// Samples returns the recorded changes.
func (m *Monitor) Samples() []Sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Sample(nil), m.samples...)
}

// Longest returns the longest stretch within [from, to) during which the
// number of holders satisfied pred.
func (m *Monitor) Longest(from, to time.Time, pred func(n int) bool) time.Duration {
	s := m.Samples()
	var longest time.Duration
	for i, x := range s {
		start := x.At
		end := to
		if i+1 < len(s) {
			end = s[i+1].At
		}
		if start.Before(from) {
			start = from
		}
		if end.After(to) {
			end = to
		}
		if end.After(start) && pred(len(x.Holders)) && end.Sub(start) > longest {
			longest = end.Sub(start)
		}
	}
	return longest
}

// String prints the timeline relative to its first sample.
func (m *Monitor) String() string {
	s := m.Samples()
	if len(s) == 0 {
		return "(no samples)"
	}
	var b strings.Builder
	for _, x := range s {
		fmt.Fprintf(&b, "%8.3fs %v\n", x.At.Sub(s[0].At).Seconds(), x.Holders)
	}
	return b.String()
}

// WaitStable waits until exactly one node has held the VIP for settle and
// returns it.
func (m *Monitor) WaitStable(ctx context.Context, settle time.Duration) (string, error) {
	var since time.Time
	last := ""
	for {
		h := m.Now()
		cur := strings.Join(h, ",")
		if len(h) == 1 && cur == last {
			if time.Since(since) >= settle {
				return h[0], nil
			}
		} else {
			since, last = time.Now(), cur
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no single stable holder of %s (now %v): %w", m.vip, h, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
