package bfd

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// SlowTxInterval is the least Desired Min TX Interval advertised while a
// session is not Up (RFC 5880 section 6.8.3).
const SlowTxInterval = time.Second

// Limits accepted by SessionConfig.Validate. FRR accepts the same range.
const (
	MinInterval = 10 * time.Millisecond
	MaxInterval = 60 * time.Second
)

// SessionConfig holds the local parameters of one session.
type SessionConfig struct {
	// DetectMult is the detection multiplier sent to the remote: it declares
	// us down after this many missed packets. 1-255. (VIPD_BFD_DETECT_MULT)
	DetectMult int
	// DesiredMinTx is the fastest rate we want to transmit at once Up.
	// (VIPD_BFD_TX_INTERVAL)
	DesiredMinTx time.Duration
	// RequiredMinRx is the fastest rate we are willing to receive at.
	// (VIPD_BFD_RX_INTERVAL)
	RequiredMinRx time.Duration
}

// DefaultSessionConfig returns the defaults of DESIGN.md: 300 ms x 3.
func DefaultSessionConfig() SessionConfig {
	return SessionConfig{DetectMult: 3, DesiredMinTx: 300 * time.Millisecond, RequiredMinRx: 300 * time.Millisecond}
}

// ErrInvalidConfig is wrapped by every SessionConfig.Validate error.
var ErrInvalidConfig = errors.New("invalid BFD session config")

// Validate reports the first setting out of range, naming it and the
// accepted form.
func (c SessionConfig) Validate() error {
	if c.DetectMult < 1 || c.DetectMult > 255 {
		return fmt.Errorf("%w: detect multiplier (VIPD_BFD_DETECT_MULT) is %d, want an integer from 1 to 255", ErrInvalidConfig, c.DetectMult)
	}
	if c.DesiredMinTx < MinInterval || c.DesiredMinTx > MaxInterval {
		return fmt.Errorf("%w: transmit interval (VIPD_BFD_TX_INTERVAL) is %v, want a duration from %v to %v such as 300ms", ErrInvalidConfig, c.DesiredMinTx, MinInterval, MaxInterval)
	}
	if c.RequiredMinRx < MinInterval || c.RequiredMinRx > MaxInterval {
		return fmt.Errorf("%w: receive interval (VIPD_BFD_RX_INTERVAL) is %v, want a duration from %v to %v such as 300ms", ErrInvalidConfig, c.RequiredMinRx, MinInterval, MaxInterval)
	}
	return nil
}

// Actions is what one input to a Session asks the driver to do.
type Actions struct {
	// Send is true when Packet must be transmitted now.
	Send   bool
	Packet ControlPacket
	// StateChanged is true when the session moved from OldState to NewState;
	// Diag is the local diagnostic after the change.
	StateChanged       bool
	OldState, NewState State
	Diag               Diag
}

// Status is a snapshot of a session for reporting. In JSON (/status) the
// durations are milliseconds, e.g. "tx_interval_ms": 300.
type Status struct {
	State               State
	LocalDiag           Diag
	RemoteState         State
	RemoteDiag          Diag
	LocalDiscriminator  uint32
	RemoteDiscriminator uint32
	LocalDetectMult     int
	LocalDesiredMinTx   time.Duration // as advertised now (>= 1 s while not Up)
	LocalRequiredMinRx  time.Duration
	RemoteDetectMult    int
	RemoteDesiredMinTx  time.Duration
	RemoteRequiredMinRx time.Duration
	// TxInterval is the negotiated transmit interval, before jitter.
	TxInterval time.Duration
	// DetectionTime is how long we wait for the remote before Down.
	DetectionTime time.Duration
	// RemoteDetectionTime is how long the remote waits for us.
	RemoteDetectionTime time.Duration
	PollInProgress      bool
}

// MarshalJSON renders durations as milliseconds.
func (s Status) MarshalJSON() ([]byte, error) {
	msf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return json.Marshal(struct {
		State               State   `json:"state"`
		LocalDiag           Diag    `json:"local_diag"`
		RemoteState         State   `json:"remote_state"`
		RemoteDiag          Diag    `json:"remote_diag"`
		LocalDiscriminator  uint32  `json:"local_discriminator"`
		RemoteDiscriminator uint32  `json:"remote_discriminator"`
		LocalDetectMult     int     `json:"local_detect_mult"`
		LocalDesiredMinTx   float64 `json:"local_desired_min_tx_ms"`
		LocalRequiredMinRx  float64 `json:"local_required_min_rx_ms"`
		RemoteDetectMult    int     `json:"remote_detect_mult"`
		RemoteDesiredMinTx  float64 `json:"remote_desired_min_tx_ms"`
		RemoteRequiredMinRx float64 `json:"remote_required_min_rx_ms"`
		TxInterval          float64 `json:"tx_interval_ms"`
		DetectionTime       float64 `json:"detection_time_ms"`
		RemoteDetectionTime float64 `json:"remote_detection_time_ms"`
		PollInProgress      bool    `json:"poll_in_progress"`
	}{
		s.State, s.LocalDiag, s.RemoteState, s.RemoteDiag, s.LocalDiscriminator, s.RemoteDiscriminator,
		s.LocalDetectMult, msf(s.LocalDesiredMinTx), msf(s.LocalRequiredMinRx),
		s.RemoteDetectMult, msf(s.RemoteDesiredMinTx), msf(s.RemoteRequiredMinRx),
		msf(s.TxInterval), msf(s.DetectionTime), msf(s.RemoteDetectionTime), s.PollInProgress,
	})
}

// Errors returned by Session.Receive for packets it discards.
var (
	ErrDiscriminatorMismatch = errors.New("bfd: your discriminator does not match the session")
	ErrSessionAdminDown      = errors.New("bfd: session is administratively down, packet discarded")
)

// Session is the RFC 5880 asynchronous-mode state machine of one session.
// It is pure: no goroutines, sockets or clock. Time enters as the now
// argument of each method; packets to send and state changes come out as
// Actions; NextDeadline says when Tick must be called next. It is not safe
// for concurrent use.
type Session struct {
	cfg  SessionConfig
	rand func() float64

	state     State
	diag      Diag
	localDisc uint32

	remoteDisc       uint32
	remoteState      State
	remoteDiag       Diag
	remoteMinRx      uint32 // µs, bfd.RemoteMinRxInterval
	remoteDesiredTx  uint32 // µs
	remoteDetectMult uint8

	// advTx/advRx are advertised in every packet (bfd.DesiredMinTxInterval,
	// bfd.RequiredMinRxInterval). actTx/actRx are the values the remote has
	// confirmed with a Final; they differ only during a Poll sequence.
	advTx, advRx uint32
	actTx, actRx uint32
	polling      bool

	nextTx   time.Time // zero: no periodic transmission
	detectAt time.Time // zero: detection timer not armed
}

// NewSession returns a session in state Down that wants to send its first
// packet at now. localDisc must be non-zero and unique on this system. rnd
// returns values in [0, 1) for the transmit jitter; nil uses math/rand/v2.
func NewSession(now time.Time, localDisc uint32, cfg SessionConfig, rnd func() float64) (*Session, error) {
	if localDisc == 0 {
		return nil, errors.New("bfd: local discriminator must not be zero")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	s := &Session{cfg: cfg, rand: rnd, state: StateDown, localDisc: localDisc, remoteMinRx: 1, nextTx: now}
	s.advTx, s.advRx = s.targetIntervals()
	s.actTx, s.actRx = s.advTx, s.advRx
	return s, nil
}

func micros(d time.Duration) uint32 { return uint32(d / time.Microsecond) }

func usec(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }

// targetIntervals is what should be advertised in the current state.
func (s *Session) targetIntervals() (tx, rx uint32) {
	tx, rx = micros(s.cfg.DesiredMinTx), micros(s.cfg.RequiredMinRx)
	if s.state != StateUp {
		tx = max(tx, micros(SlowTxInterval))
	}
	return tx, rx
}

// txInterval is the negotiated transmit interval before jitter (6.8.7):
// while a Poll is running an increase of our TX has not taken effect yet.
func (s *Session) txInterval() time.Duration {
	return usec(max(min(s.actTx, s.advTx), s.remoteMinRx))
}

// detectionTime is how long we wait for the remote (6.8.4): while a Poll
// is running a decrease of our RX has not taken effect yet.
func (s *Session) detectionTime() time.Duration {
	return time.Duration(s.remoteDetectMult) * usec(max(max(s.actRx, s.advRx), s.remoteDesiredTx))
}

// jittered reduces d by 0-25 %, or by 10-25 % when DetectMult is 1 (6.8.7).
func (s *Session) jittered(d time.Duration) time.Duration {
	r := s.rand()
	if r < 0 || r >= 1 {
		r = 0
	}
	frac := 0.25 * r
	if s.cfg.DetectMult == 1 {
		frac = 0.10 + 0.15*r
	}
	return d - time.Duration(float64(d)*frac)
}

// scheduleAfterSend sets the next periodic transmission after a packet
// went out at now.
func (s *Session) scheduleAfterSend(now time.Time) {
	if s.remoteMinRx == 0 {
		s.nextTx = time.Time{} // 6.8.7: the remote asked for no packets
		return
	}
	s.nextTx = now.Add(s.jittered(s.txInterval()))
}

// reschedule pulls the next transmission forward when the negotiated
// interval shrank, so the remote does not wait on the old, slower schedule.
func (s *Session) reschedule(now time.Time) {
	if s.remoteMinRx == 0 {
		s.nextTx = time.Time{}
		return
	}
	next := now.Add(s.jittered(s.txInterval()))
	if s.nextTx.IsZero() || next.Before(s.nextTx) {
		s.nextTx = next
	}
}

// refreshIntervals brings the advertised intervals in line with the state
// and the config. While Up a change starts a Poll sequence (6.8.3) and
// pollStarted is true; a change asked for during a Poll waits for its end.
func (s *Session) refreshIntervals() (pollStarted bool) {
	tx, rx := s.targetIntervals()
	if tx == s.advTx && rx == s.advRx {
		return false
	}
	if s.polling {
		return false // re-evaluated when the Final arrives
	}
	s.advTx, s.advRx = tx, rx
	if s.state == StateUp {
		s.polling = true
		return true
	}
	s.actTx, s.actRx = tx, rx
	return false
}

func (s *Session) setState(st State, diag Diag, a *Actions) {
	if st == s.state {
		return
	}
	if !a.StateChanged {
		a.OldState = s.state
	}
	a.StateChanged = true
	s.state, s.diag = st, diag
	a.NewState, a.Diag = st, diag
	if st != StateUp {
		// A Poll only matters while Up; drop it so the slow rate applies now.
		s.polling = false
		s.advTx, s.advRx = s.targetIntervals()
		s.actTx, s.actRx = s.advTx, s.advRx
	}
}

func (s *Session) packet(final bool) ControlPacket {
	return ControlPacket{
		Diag:                  s.diag,
		State:                 s.state,
		Poll:                  s.polling && !final,
		Final:                 final,
		DetectMult:            uint8(s.cfg.DetectMult),
		MyDiscriminator:       s.localDisc,
		YourDiscriminator:     s.remoteDisc,
		DesiredMinTxInterval:  s.advTx,
		RequiredMinRxInterval: s.advRx,
	}
}

// Receive processes a packet that passed UnmarshalBinary (RFC 5880 section
// 6.8.6). A non-nil error means the packet was discarded.
func (s *Session) Receive(now time.Time, p *ControlPacket) (Actions, error) {
	var a Actions
	if p.YourDiscriminator != 0 && p.YourDiscriminator != s.localDisc {
		return a, ErrDiscriminatorMismatch
	}
	// Learn from every valid packet, also a new MyDisc after the remote
	// re-created its session.
	s.remoteDisc = p.MyDiscriminator
	s.remoteState = p.State
	s.remoteDiag = p.Diag
	s.remoteDesiredTx = p.DesiredMinTxInterval
	s.remoteDetectMult = p.DetectMult
	oldRemoteMinRx := s.remoteMinRx
	s.remoteMinRx = p.RequiredMinRxInterval
	pollEnded := false
	if p.Final && s.polling {
		s.polling = false
		s.actTx, s.actRx = s.advTx, s.advRx
		pollEnded = true
	}
	s.detectAt = now.Add(s.detectionTime())

	if s.state == StateAdminDown {
		return a, ErrSessionAdminDown
	}

	if p.State == StateAdminDown {
		if s.state != StateDown {
			s.setState(StateDown, DiagNeighborDown, &a)
		}
	} else {
		switch s.state {
		case StateDown:
			switch p.State {
			case StateDown:
				s.setState(StateInit, DiagNone, &a)
			case StateInit:
				s.setState(StateUp, DiagNone, &a)
			}
		case StateInit:
			if p.State == StateInit || p.State == StateUp {
				s.setState(StateUp, DiagNone, &a)
			}
		case StateUp:
			if p.State == StateDown {
				s.setState(StateDown, DiagNeighborDown, &a)
			}
		}
	}

	pollStarted := false
	if a.StateChanged || pollEnded {
		pollStarted = s.refreshIntervals()
	}
	if a.StateChanged || pollEnded || s.remoteMinRx != oldRemoteMinRx {
		// The detection time may depend on the new state's intervals.
		s.detectAt = now.Add(s.detectionTime())
		if !a.StateChanged {
			s.reschedule(now)
		}
	}
	switch {
	case a.StateChanged || pollStarted:
		a.Send, a.Packet = true, s.packet(p.Poll)
		s.scheduleAfterSend(now)
	case p.Poll:
		// 6.5: answer a Poll at once with a Final, outside the TX schedule.
		a.Send, a.Packet = true, s.packet(true)
	}
	return a, nil
}

// Tick handles the timers: detection timeout and periodic transmission.
// Call it at NextDeadline (calling it earlier does nothing harmful).
func (s *Session) Tick(now time.Time) Actions {
	var a Actions
	if !s.detectAt.IsZero() && !now.Before(s.detectAt) {
		s.detectAt = time.Time{}
		// 6.8.1 and 6.8.18: forget the remote after a Detection Time of silence.
		s.remoteDisc = 0
		s.remoteMinRx = 1
		s.remoteState = StateDown
		if s.state == StateInit || s.state == StateUp {
			s.setState(StateDown, DiagControlDetectExpired, &a)
		}
		if s.nextTx.IsZero() {
			s.reschedule(now) // transmission resumes if the remote had stopped it
		}
	}
	if a.StateChanged || (!s.nextTx.IsZero() && !now.Before(s.nextTx)) {
		a.Send, a.Packet = true, s.packet(false)
		s.scheduleAfterSend(now)
	}
	return a
}

// SetConfig changes the local parameters. While Up a change of intervals
// starts a Poll sequence: a faster TX or a slower RX applies at once, the
// rest once the remote answers with a Final (6.8.3).
func (s *Session) SetConfig(now time.Time, cfg SessionConfig) (Actions, error) {
	var a Actions
	if err := cfg.Validate(); err != nil {
		return a, err
	}
	s.cfg = cfg
	if s.refreshIntervals() {
		a.Send, a.Packet = true, s.packet(false)
		s.scheduleAfterSend(now)
	}
	if !s.detectAt.IsZero() {
		s.detectAt = now.Add(s.detectionTime())
	}
	s.reschedule(now)
	return a, nil
}

// SetAdminDown takes the session administratively down with diag (use
// DiagAdminDown on shutdown) and sends an AdminDown packet at once. The
// session keeps sending AdminDown at the slow rate (6.8.16).
func (s *Session) SetAdminDown(now time.Time, diag Diag) Actions {
	var a Actions
	if s.state == StateAdminDown {
		return a
	}
	s.setState(StateAdminDown, diag, &a)
	a.Send, a.Packet = true, s.packet(false)
	s.scheduleAfterSend(now)
	return a
}

// SetAdminUp re-enables an administratively down session (state Down).
func (s *Session) SetAdminUp(now time.Time) Actions {
	var a Actions
	if s.state != StateAdminDown {
		return a
	}
	s.setState(StateDown, DiagNone, &a)
	a.Send, a.Packet = true, s.packet(false)
	s.scheduleAfterSend(now)
	return a
}

// NextDeadline is when Tick must be called next.
func (s *Session) NextDeadline() time.Time {
	switch {
	case s.nextTx.IsZero():
		return s.detectAt
	case s.detectAt.IsZero() || s.nextTx.Before(s.detectAt):
		return s.nextTx
	}
	return s.detectAt
}

// State returns the current session state.
func (s *Session) State() State { return s.state }

// Status returns a snapshot for reporting.
func (s *Session) Status() Status {
	return Status{
		State:               s.state,
		LocalDiag:           s.diag,
		RemoteState:         s.remoteState,
		RemoteDiag:          s.remoteDiag,
		LocalDiscriminator:  s.localDisc,
		RemoteDiscriminator: s.remoteDisc,
		LocalDetectMult:     s.cfg.DetectMult,
		LocalDesiredMinTx:   usec(s.advTx),
		LocalRequiredMinRx:  usec(s.advRx),
		RemoteDetectMult:    int(s.remoteDetectMult),
		RemoteDesiredMinTx:  usec(s.remoteDesiredTx),
		RemoteRequiredMinRx: usec(s.remoteMinRx),
		TxInterval:          s.txInterval(),
		DetectionTime:       s.detectionTime(),
		RemoteDetectionTime: time.Duration(s.cfg.DetectMult) * usec(max(s.advTx, s.remoteMinRx)),
		PollInProgress:      s.polling,
	}
}
