package lab

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Answer is one probe: when it was sent and who answered ("" for none,
// with Err saying why).
type Answer struct {
	Sent time.Time
	Node string
	RTT  time.Duration
	Err  string `json:",omitempty"`
}

// Prober opens a fresh TLS connection to an address every period from a
// host and records who answered. Probes run concurrently, so a hanging
// one does not delay the next.
type Prober struct {
	mu      sync.Mutex
	answers []Answer
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// StartProber starts probing addr (host:port) from h every period.
func (h *Host) StartProber(addr string, period, timeout time.Duration) *Prober {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prober{cancel: cancel}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			p.wg.Add(1)
			go func(sent time.Time) {
				defer p.wg.Done()
				name, err := h.Probe(ctx, addr, timeout)
				a := Answer{Sent: sent, Node: name, RTT: time.Since(sent)}
				if err != nil {
					a.Node, a.Err = "", err.Error()
				}
				p.mu.Lock()
				p.answers = append(p.answers, a)
				p.mu.Unlock()
			}(time.Now())
		}
	}()
	h.lab.OnClose(p.Stop)
	return p
}

// Stop ends probing and waits for probes in flight.
func (p *Prober) Stop() {
	p.cancel()
	p.wg.Wait()
}

// Answers returns the probes so far, ordered by send time.
func (p *Prober) Answers() []Answer {
	p.mu.Lock()
	a := append([]Answer(nil), p.answers...)
	p.mu.Unlock()
	sort.Slice(a, func(i, j int) bool { return a[i].Sent.Before(a[j].Sent) })
	return a
}

// Outage returns the longest time in [from, to] between two answered
// probes with only unanswered ones in between: what a client of the VIP
// saw as downtime. It also returns who answered last before and first
// after that gap.
func Outage(ans []Answer, from, to time.Time) (gap time.Duration, before, after string) {
	var lastOK *Answer
	for i := range ans {
		a := &ans[i]
		if a.Sent.Before(from) {
			if a.Node != "" {
				lastOK = a
			}
			continue
		}
		if a.Sent.After(to) {
			break
		}
		if a.Node == "" {
			continue
		}
		if lastOK != nil {
			if d := a.Sent.Sub(lastOK.Sent); d > gap {
				gap, before, after = d, lastOK.Node, a.Node
			}
		}
		lastOK = a
	}
	return gap, before, after
}
