package health

import (
	"bytes"
	"net/http"
	"time"
)

// Why a node drains: the apiserver announced its graceful shutdown, or its
// listener went away between two probes.
const (
	// DrainShutdown: /readyz fails its "shutdown" check while /livez is
	// still served (kube-apiserver after SIGTERM, during
	// --shutdown-delay-duration).
	DrainShutdown = "apiserver_shutdown"
	// DrainRefused: /livez was refused right after a good probe: nothing
	// listens on the apiserver's port any more (a graceful stop without a
	// shutdown delay closes the listener at once).
	DrainRefused = "apiserver_refused"
)

// Readyz is what one probe of the readyz URL said about the shutdown
// check.
type Readyz int

const (
	// ReadyzUnknown: not probed, or the answer does not tell (an error,
	// a status without the check list, a check list that fails for
	// other reasons only).
	ReadyzUnknown Readyz = iota
	// ReadyzServing: the shutdown check passes (200, or a failing answer
	// that lists "[+]shutdown ok").
	ReadyzServing
	// ReadyzShutdown: the answer lists "[-]shutdown failed".
	ReadyzShutdown
)

func (r Readyz) String() string {
	switch r {
	case ReadyzServing:
		return "serving"
	case ReadyzShutdown:
		return "shutdown"
	}
	return "unknown"
}

// JudgeReadyz classifies an answer of kube-apiserver's /readyz. A failing
// /readyz lists every check, "[-]shutdown failed: reason withheld" among
// them once the server received SIGTERM (k8s.io/apiserver's healthz
// handler prints the list on failure even without ?verbose).
func JudgeReadyz(code int, body []byte) Readyz {
	switch {
	case bytes.Contains(body, []byte("[-]shutdown failed")):
		return ReadyzShutdown
	case code == http.StatusOK, bytes.Contains(body, []byte("[+]shutdown ok")):
		return ReadyzServing
	}
	return ReadyzUnknown
}

// Drain decides when the apiserver is going away while this node may
// still hold the VIP, so that the VIP is handed over in a planned transfer
// before clients see the apiserver stop, not after the fail threshold. It
// does no I/O and reads no clock: probe results come in with their time.
//
// An episode starts when /readyz reports the shutdown (while /livez is
// still served) or when /livez is refused right after a good probe. While
// it lasts the node asks for a handover after every probe until one
// finished with nothing left held here (HandedOver(true)); from then on
// the node reports itself ineligible (Eligible) so that the VIP is not
// handed back while its apiserver stops. The episode ends with a good
// /livez probe after the apiserver went away (a failed /livez probe) or
// whose /readyz says the shutdown check passes: the apiserver was
// restarted. An episode started by a refused probe also ends with a good
// probe whose /readyz does not report a shutdown.
type Drain struct {
	draining   bool
	reason     string
	since      time.Time
	handing    bool // a handover asked for has not finished
	handedOver bool // a handover finished with nothing left held
	gone       bool // /livez failed during the episode
	lastOK     bool // the previous /livez probe succeeded
}

// DrainDecision is what the node does after one probe.
type DrainDecision struct {
	// Draining: an episode is under way.
	Draining bool
	// Reason is the episode's cause (DrainShutdown or DrainRefused).
	Reason string
	// Since is when the episode started.
	Since time.Time
	// HandOver: ask the election for a planned handover of every VIP
	// held now, and report back with HandedOver.
	HandOver bool
	// Changed: Draining differs from before this probe.
	Changed bool
}

// Observe feeds one probe: the /livez result and what /readyz said
// (ReadyzUnknown when it was not probed).
func (d *Drain) Observe(livez Result, readyz Readyz, now time.Time) DrainDecision {
	was := d.draining
	switch {
	case livez.OK && readyz == ReadyzShutdown:
		d.start(DrainShutdown, now)
	case livez.OK && (readyz == ReadyzServing || d.gone || d.reason != DrainShutdown):
		// Serving: the apiserver is back (it went away in between, or
		// its /readyz says so), or a refused probe was a blip between
		// two good ones. A /readyz that does not answer alone does not
		// end a shutdown.
		d.stop()
	case livez.OK:
	case livez.Reason == ReasonRefused && d.lastOK:
		d.start(DrainRefused, now)
	}
	if !livez.OK && d.draining {
		d.gone = true
	}
	d.lastOK = livez.OK
	dec := d.decision()
	dec.Changed = d.draining != was
	if d.draining && !d.handing && !d.handedOver {
		d.handing = true
		dec.HandOver = true
	}
	return dec
}

func (d *Drain) start(reason string, now time.Time) {
	if d.draining {
		if reason == DrainShutdown {
			d.reason = reason // the more telling cause wins
		}
		return
	}
	*d = Drain{draining: true, reason: reason, since: now, lastOK: d.lastOK}
}

func (d *Drain) stop() { *d = Drain{lastOK: d.lastOK} }

// HandedOver reports how the handover asked for ended: done is true when
// nothing is held here any more (every VIP was handed over, or none was
// held). Otherwise the next probe of the episode asks again.
func (d *Drain) HandedOver(done bool) {
	d.handing = false
	if d.draining && done {
		d.handedOver = true
	}
}

// Eligible tells whether a node whose /livez thresholds say healthy may be
// reported healthy to the election: not once it handed its VIPs over in a
// drain, until the episode ends.
func (d *Drain) Eligible(healthy bool) bool { return healthy && !(d.draining && d.handedOver) }

func (d *Drain) decision() DrainDecision {
	return DrainDecision{Draining: d.draining, Reason: d.reason, Since: d.since}
}
