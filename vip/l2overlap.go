package vip

import (
	"net/netip"
	"sync"
	"time"
)

// overlapWindows are the planned transfers' agreed make-before-break
// overlaps (the lease election's Output.Overlaps): while one runs, the old
// holder and the successor both hold the address, and the other one's
// claims are neither a conflict to report nor one to defend against (a
// defence by the old holder would pull the clients back to the node that
// lets go a moment later). The zero value is ready.
type overlapWindows struct {
	mu    sync.Mutex
	until map[netip.Addr]time.Time
}

func (w *overlapWindows) set(addr netip.Addr, until time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if until.IsZero() {
		delete(w.until, addr)
		return
	}
	if w.until == nil {
		w.until = map[netip.Addr]time.Time{}
	}
	w.until[addr] = until
}

func (w *overlapWindows) in(addr netip.Addr, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	u, ok := w.until[addr]
	if ok && !now.Before(u) {
		delete(w.until, addr)
		return false
	}
	return ok
}

// AgreedOverlap tells the conflict guard that until then another host's
// claims of addr are a planned transfer's agreed overlap, not a conflict
// (neither reported nor defended); a zero until ends the window now.
func (l *L2) AgreedOverlap(addr netip.Addr, until time.Time) { l.overlaps.set(addr, until) }
