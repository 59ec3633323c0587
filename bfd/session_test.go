package bfd

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

const (
	ms       = time.Millisecond
	localD   = uint32(0x1111)
	remoteD  = uint32(0x2222)
	remoteD2 = uint32(0x3333)
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fixture drives one Session with a fake clock and a fixed jitter value.
type fixture struct {
	t   *testing.T
	s   *Session
	rnd float64
}

func newFixture(t *testing.T, cfg SessionConfig) *fixture {
	t.Helper()
	f := &fixture{t: t}
	s, err := NewSession(t0, localD, cfg, func() float64 { return f.rnd })
	if err != nil {
		t.Fatal(err)
	}
	f.s = s
	return f
}

func at(d time.Duration) time.Time { return t0.Add(d) }

// remote builds a packet from the FRR-like remote: 100 ms x 3 when Up,
// 1 s TX while not Up, and our discriminator once it knows it.
func remote(st State, mods ...func(*ControlPacket)) *ControlPacket {
	p := &ControlPacket{State: st, DetectMult: 3, MyDiscriminator: remoteD, YourDiscriminator: localD,
		DesiredMinTxInterval: 100_000, RequiredMinRxInterval: 100_000}
	if st != StateUp {
		p.DesiredMinTxInterval = 1_000_000
	}
	if st == StateDown || st == StateAdminDown {
		p.YourDiscriminator = 0
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func withPoll(p *ControlPacket)  { p.Poll = true }
func withFinal(p *ControlPacket) { p.Final = true }
func withYour(d uint32) func(*ControlPacket) {
	return func(p *ControlPacket) { p.YourDiscriminator = d }
}
func withMy(d uint32) func(*ControlPacket) { return func(p *ControlPacket) { p.MyDiscriminator = d } }
func withTx(us uint32) func(*ControlPacket) {
	return func(p *ControlPacket) { p.DesiredMinTxInterval = us }
}
func withRx(us uint32) func(*ControlPacket) {
	return func(p *ControlPacket) { p.RequiredMinRxInterval = us }
}
func withMult(m uint8) func(*ControlPacket) { return func(p *ControlPacket) { p.DetectMult = m } }

func (f *fixture) rx(d time.Duration, p *ControlPacket) Actions {
	f.t.Helper()
	a, err := f.s.Receive(at(d), p)
	if err != nil {
		f.t.Fatalf("Receive at %v: %v", d, err)
	}
	return a
}

// up brings the session Up at time d via Down->Init->Up, and completes the
// Poll our Up starts, so the session is in steady state.
func (f *fixture) up(d time.Duration) {
	f.t.Helper()
	f.rx(d, remote(StateDown))
	f.rx(d, remote(StateUp))
	if f.s.State() != StateUp {
		f.t.Fatalf("state %v, want up", f.s.State())
	}
	f.rx(d, remote(StateUp, withFinal))
	if f.s.Status().PollInProgress {
		f.t.Fatal("poll still running after Final")
	}
}

func wantChange(t *testing.T, a Actions, from, to State, diag Diag) {
	t.Helper()
	if !a.StateChanged || a.OldState != from || a.NewState != to || a.Diag != diag {
		t.Fatalf("actions %+v, want change %v -> %v diag %v", a, from, to, diag)
	}
	if !a.Send || a.Packet.State != to || a.Packet.Diag != diag {
		t.Fatalf("a state change must send a packet with the new state and diag at once: %+v", a)
	}
}

func wantNoChange(t *testing.T, a Actions) {
	t.Helper()
	if a.StateChanged {
		t.Fatalf("unexpected state change %v -> %v", a.OldState, a.NewState)
	}
}

func TestNewSessionFirstPacket(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	if got := f.s.NextDeadline(); !got.Equal(t0) {
		t.Fatalf("first deadline %v, want now", got)
	}
	a := f.s.Tick(t0)
	want := ControlPacket{State: StateDown, DetectMult: 3, MyDiscriminator: localD,
		DesiredMinTxInterval: 1_000_000, RequiredMinRxInterval: 300_000}
	if !a.Send || a.Packet != want {
		t.Fatalf("first packet %+v, want %+v", a.Packet, want)
	}
	// Not Up: at least 1 s between packets, and nothing before.
	if got := f.s.NextDeadline(); !got.Equal(at(time.Second)) {
		t.Fatalf("next deadline %v, want +1s", got.Sub(t0))
	}
	if a := f.s.Tick(at(999 * ms)); a.Send {
		t.Fatal("sent before the deadline")
	}
	if _, err := NewSession(t0, 0, DefaultSessionConfig(), nil); err == nil {
		t.Fatal("zero discriminator accepted")
	}
}

// Every transition of RFC 5880 section 6.8.6.
func TestTransitions(t *testing.T) {
	type tc struct {
		name     string
		from     State
		rx       State
		to       State
		diag     Diag
		changed  bool
		wantErr  error
		yourDisc uint32 // in the packet we send afterwards
	}
	tests := []tc{
		{"down+down", StateDown, StateDown, StateInit, DiagNone, true, nil, remoteD},
		{"down+init", StateDown, StateInit, StateUp, DiagNone, true, nil, remoteD},
		{"down+up", StateDown, StateUp, StateDown, DiagNone, false, nil, remoteD},
		{"down+admindown", StateDown, StateAdminDown, StateDown, DiagNone, false, nil, remoteD},
		{"init+down", StateInit, StateDown, StateInit, DiagNone, false, nil, remoteD},
		{"init+init", StateInit, StateInit, StateUp, DiagNone, true, nil, remoteD},
		{"init+up", StateInit, StateUp, StateUp, DiagNone, true, nil, remoteD},
		{"init+admindown", StateInit, StateAdminDown, StateDown, DiagNeighborDown, true, nil, remoteD},
		{"up+down", StateUp, StateDown, StateDown, DiagNeighborDown, true, nil, remoteD},
		{"up+init", StateUp, StateInit, StateUp, DiagNone, false, nil, remoteD},
		{"up+up", StateUp, StateUp, StateUp, DiagNone, false, nil, remoteD},
		{"up+admindown", StateUp, StateAdminDown, StateDown, DiagNeighborDown, true, nil, remoteD},
		{"admindown+down", StateAdminDown, StateDown, StateAdminDown, DiagAdminDown, false, ErrSessionAdminDown, remoteD},
		{"admindown+init", StateAdminDown, StateInit, StateAdminDown, DiagAdminDown, false, ErrSessionAdminDown, remoteD},
		{"admindown+up", StateAdminDown, StateUp, StateAdminDown, DiagAdminDown, false, ErrSessionAdminDown, remoteD},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, DefaultSessionConfig())
			switch tt.from {
			case StateInit:
				f.rx(0, remote(StateDown))
			case StateUp:
				f.up(0)
			case StateAdminDown:
				f.s.SetAdminDown(t0, DiagAdminDown)
			}
			if f.s.State() != tt.from {
				t.Fatalf("setup: state %v, want %v", f.s.State(), tt.from)
			}
			a, err := f.s.Receive(at(10*ms), remote(tt.rx))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if tt.changed {
				wantChange(t, a, tt.from, tt.to, tt.diag)
				if a.Packet.YourDiscriminator != tt.yourDisc || a.Packet.MyDiscriminator != localD {
					t.Fatalf("discriminators in %+v", a.Packet)
				}
			} else {
				wantNoChange(t, a)
				if a.Send {
					t.Fatalf("sent %+v without a state change or poll", a.Packet)
				}
			}
			if f.s.State() != tt.to {
				t.Fatalf("state %v, want %v", f.s.State(), tt.to)
			}
			if st := f.s.Status(); st.LocalDiag != tt.diag && tt.changed {
				t.Fatalf("diag %v, want %v", st.LocalDiag, tt.diag)
			}
		})
	}
}

func TestReceiveDiscriminatorMismatch(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.up(0)
	a, err := f.s.Receive(at(ms), remote(StateDown, withYour(0x9999)))
	if !errors.Is(err, ErrDiscriminatorMismatch) || a.Send || f.s.State() != StateUp {
		t.Fatalf("err %v actions %+v state %v", err, a, f.s.State())
	}
}

func TestDetectionTimeout(t *testing.T) {
	for _, from := range []State{StateInit, StateUp} {
		t.Run(from.String(), func(t *testing.T) {
			f := newFixture(t, DefaultSessionConfig())
			f.rx(0, remote(StateDown))
			if from == StateUp {
				f.up(0)
			}
			// Init: remote TX 1 s -> 3 x max(300 ms, 1 s) = 3 s.
			// Up:   remote TX 100 ms -> 3 x max(300 ms, 100 ms) = 900 ms.
			det := 3 * time.Second
			if from == StateUp {
				det = 900 * ms
			}
			if got := f.s.Status().DetectionTime; got != det {
				t.Fatalf("detection time %v, want %v", got, det)
			}
			// Just before: still alive.
			f.s.Tick(at(det - time.Microsecond))
			if f.s.State() != from {
				t.Fatalf("expired early: %v", f.s.State())
			}
			a := f.s.Tick(at(det))
			wantChange(t, a, from, StateDown, DiagControlDetectExpired)
			if a.Packet.YourDiscriminator != 0 {
				t.Fatalf("remote discriminator not forgotten: %+v", a.Packet)
			}
			if a.Packet.DesiredMinTxInterval != 1_000_000 {
				t.Fatalf("not back to the slow rate: %+v", a.Packet)
			}
			// A packet refreshes the timer: no second expiry.
			if a := f.s.Tick(at(det + 10*time.Second)); a.StateChanged {
				t.Fatal("second expiry")
			}
		})
	}
}

func TestDetectionTimerResetByPackets(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.up(0)
	for d := 800 * ms; d < 5*time.Second; d += 800 * ms {
		f.rx(d, remote(StateUp))
		f.s.Tick(at(d + 799*ms))
		if f.s.State() != StateUp {
			t.Fatalf("down at %v although packets arrive every 800 ms (< 900 ms)", d)
		}
	}
}

func TestDetectionExpiryInDownForgetsRemote(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.rx(0, remote(StateAdminDown)) // stays Down, but arms the timer (3 x 1 s)
	if f.s.Status().RemoteDiscriminator != remoteD {
		t.Fatal("remote discriminator not learned")
	}
	a := f.s.Tick(at(3 * time.Second))
	wantNoChange(t, a)
	if st := f.s.Status(); st.RemoteDiscriminator != 0 || st.RemoteRequiredMinRx != time.Microsecond {
		t.Fatalf("remote not forgotten: %+v", st)
	}
}

func TestDetectionTimeFormula(t *testing.T) {
	tests := []struct {
		name         string
		localRx      time.Duration
		remoteTx     uint32
		remoteMult   uint8
		wantDetect   time.Duration
		localTx      time.Duration
		remoteRx     uint32
		wantInterval time.Duration
	}{
		{"local rx dominates", 300 * ms, 100_000, 3, 900 * ms, 300 * ms, 100_000, 300 * ms},
		{"remote tx dominates", 100 * ms, 500_000, 3, 1500 * ms, 100 * ms, 100_000, 100 * ms},
		{"remote mult 5", 100 * ms, 100_000, 5, 500 * ms, 100 * ms, 250_000, 250 * ms},
		{"remote rx dominates tx", 50 * ms, 200_000, 3, 600 * ms, 50 * ms, 400_000, 400 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, SessionConfig{DetectMult: 3, DesiredMinTx: tt.localTx, RequiredMinRx: tt.localRx})
			mods := []func(*ControlPacket){withTx(tt.remoteTx), withRx(tt.remoteRx), withMult(tt.remoteMult)}
			f.rx(0, remote(StateDown, mods...))
			f.rx(0, remote(StateUp, mods...))
			f.rx(0, remote(StateUp, append(mods, withFinal)...))
			st := f.s.Status()
			if st.DetectionTime != tt.wantDetect {
				t.Errorf("detection %v, want %v", st.DetectionTime, tt.wantDetect)
			}
			if st.TxInterval != tt.wantInterval {
				t.Errorf("tx interval %v, want %v", st.TxInterval, tt.wantInterval)
			}
			// With no jitter the periodic packet is exactly one interval later.
			f.s.Tick(at(0)) // nothing due
			next := f.s.NextDeadline()
			if tt.wantInterval < tt.wantDetect && !next.Equal(at(tt.wantInterval)) {
				t.Errorf("next TX at %v, want %v", next.Sub(t0), tt.wantInterval)
			}
			if a := f.s.Tick(at(tt.wantInterval)); !a.Send || a.Packet.Poll || a.Packet.State != StateUp {
				t.Errorf("periodic packet %+v", a)
			}
		})
	}
}

func TestSlowTxWhileNotUp(t *testing.T) {
	// Even with a 10 ms config, Down and Init advertise and use >= 1 s.
	f := newFixture(t, SessionConfig{DetectMult: 3, DesiredMinTx: 10 * ms, RequiredMinRx: 10 * ms})
	a := f.s.Tick(t0)
	if a.Packet.DesiredMinTxInterval != 1_000_000 || a.Packet.RequiredMinRxInterval != 10_000 {
		t.Fatalf("down packet %+v", a.Packet)
	}
	f.rx(0, remote(StateDown, withRx(10_000)))
	if f.s.State() != StateInit {
		t.Fatal("not init")
	}
	if st := f.s.Status(); st.TxInterval != time.Second {
		t.Fatalf("init tx interval %v, want 1s", st.TxInterval)
	}
	if !f.s.NextDeadline().Equal(at(time.Second)) {
		t.Fatalf("next %v", f.s.NextDeadline().Sub(t0))
	}
}

func TestJitter(t *testing.T) {
	tests := []struct {
		mult int
		rnd  float64
		want time.Duration // of a 300 ms interval
	}{
		{3, 0, 300 * ms},
		{3, 0.5, 262500 * time.Microsecond},
		{3, 0.999999, 225*ms + 45*time.Nanosecond},
		{1, 0, 270 * ms},                           // at most 90 %
		{1, 0.999999, 225*ms + 45*time.Nanosecond}, // at least 75 %
		{3, 1.5, 300 * ms},                         // out-of-range source: no jitter rather than nonsense
	}
	for _, tt := range tests {
		f := newFixture(t, SessionConfig{DetectMult: tt.mult, DesiredMinTx: 300 * ms, RequiredMinRx: 300 * ms})
		f.up(0)
		f.rnd = tt.rnd
		// The next periodic send (at 300 ms) schedules the following one with rnd.
		start := f.s.NextDeadline()
		if a := f.s.Tick(start); !a.Send {
			t.Fatalf("no periodic packet at %v", start.Sub(t0))
		}
		got := f.s.NextDeadline().Sub(start)
		diff := got - tt.want
		if diff < -time.Microsecond || diff > time.Microsecond {
			t.Errorf("mult %d rnd %v: gap %v, want %v", tt.mult, tt.rnd, got, tt.want)
		}
	}
}

func TestPollOnUpAndFinal(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.rx(0, remote(StateDown))
	a := f.rx(0, remote(StateUp))
	wantChange(t, a, StateInit, StateUp, DiagNone)
	if !a.Packet.Poll || a.Packet.Final || a.Packet.DesiredMinTxInterval != 300_000 {
		t.Fatalf("Up packet must poll with the fast interval: %+v", a.Packet)
	}
	// The decrease 1 s -> 300 ms applies at once, before the Final.
	if st := f.s.Status(); st.TxInterval != 300*ms || !st.PollInProgress {
		t.Fatalf("status %+v", st)
	}
	if !f.s.NextDeadline().Equal(at(300 * ms)) {
		t.Fatalf("next TX %v, want 300ms (rescheduled from the 1 s slow rate)", f.s.NextDeadline().Sub(t0))
	}
	// Periodic packets keep P until the Final.
	if a := f.s.Tick(at(300 * ms)); !a.Packet.Poll {
		t.Fatalf("periodic packet during poll lacks P: %+v", a.Packet)
	}
	a = f.rx(310*ms, remote(StateUp, withFinal))
	if a.Send {
		t.Fatalf("a Final needs no answer: %+v", a)
	}
	if f.s.Status().PollInProgress {
		t.Fatal("poll not terminated by Final")
	}
	if a := f.s.Tick(at(600 * ms)); !a.Send || a.Packet.Poll {
		t.Fatalf("after Final P must be clear: %+v", a.Packet)
	}
}

func TestReplyFinalToPoll(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.up(0)
	next := f.s.NextDeadline()
	a := f.rx(50*ms, remote(StateUp, withPoll, withRx(200_000)))
	if !a.Send || !a.Packet.Final || a.Packet.Poll || a.Packet.State != StateUp {
		t.Fatalf("want immediate Final: %+v", a)
	}
	wantNoChange(t, a)
	// Remote RX 200 ms < local TX 300 ms: interval unchanged, schedule kept.
	if !f.s.NextDeadline().Equal(next) {
		t.Fatalf("Final moved the TX schedule: %v -> %v", next.Sub(t0), f.s.NextDeadline().Sub(t0))
	}
	// Down + Poll: the Final also goes out, together with the state change.
	g := newFixture(t, DefaultSessionConfig())
	a = g.rx(0, remote(StateDown, withPoll))
	if !a.Send || !a.Packet.Final || a.Packet.State != StateInit {
		t.Fatalf("state change packet must carry F: %+v", a.Packet)
	}
}

func TestRemoteMinRxZeroStopsPeriodicTx(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.up(0)
	f.rx(10*ms, remote(StateUp, withRx(0)))
	// Only the detection timer is left.
	if got, want := f.s.NextDeadline(), at(10*ms+900*ms); !got.Equal(want) {
		t.Fatalf("next deadline %v, want detection at %v", got.Sub(t0), want.Sub(t0))
	}
	if a := f.s.Tick(at(500 * ms)); a.Send {
		t.Fatal("periodic packet although the remote asked for none")
	}
	if a := f.rx(600*ms, remote(StateUp, withRx(0), withPoll)); !a.Send || !a.Packet.Final {
		t.Fatal("a Poll must still be answered")
	}
	// The remote asks again: TX resumes at once.
	f.rx(700*ms, remote(StateUp))
	if got := f.s.NextDeadline(); !got.Equal(at(1000 * ms)) {
		t.Fatalf("TX not resumed: next %v", got.Sub(t0))
	}
}

func TestRescheduleWhenIntervalShrinks(t *testing.T) {
	f := newFixture(t, SessionConfig{DetectMult: 3, DesiredMinTx: 100 * ms, RequiredMinRx: 100 * ms})
	f.rx(0, remote(StateDown))
	f.rx(0, remote(StateUp, withRx(2_000_000), withTx(1_000_000))) // remote wants us slow: 2 s
	f.rx(0, remote(StateUp, withRx(2_000_000), withTx(1_000_000), withFinal))
	if got := f.s.NextDeadline(); !got.Equal(at(2 * time.Second)) {
		t.Fatalf("next %v, want 2s", got.Sub(t0))
	}
	f.rx(50*ms, remote(StateUp)) // remote now accepts 100 ms
	if got := f.s.NextDeadline(); !got.Equal(at(150 * ms)) {
		t.Fatalf("TX timer not pulled forward: next %v, want 150ms", got.Sub(t0))
	}
}

func TestSetConfigPoll(t *testing.T) {
	base := DefaultSessionConfig()

	t.Run("tx increase waits for final", func(t *testing.T) {
		f := newFixture(t, base)
		f.up(0)
		cfg := base
		cfg.DesiredMinTx = 600 * ms
		a, err := f.s.SetConfig(at(10*ms), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !a.Send || !a.Packet.Poll || a.Packet.DesiredMinTxInterval != 600_000 {
			t.Fatalf("want an immediate Poll with the new interval: %+v", a.Packet)
		}
		if st := f.s.Status(); st.TxInterval != 300*ms {
			t.Fatalf("increase applied before Final: %v", st.TxInterval)
		}
		f.rx(20*ms, remote(StateUp, withFinal))
		if st := f.s.Status(); st.TxInterval != 600*ms || st.PollInProgress {
			t.Fatalf("after Final: %+v", st)
		}
	})
	t.Run("tx decrease applies at once", func(t *testing.T) {
		f := newFixture(t, base)
		f.up(0)
		cfg := base
		cfg.DesiredMinTx = 100 * ms
		a, _ := f.s.SetConfig(at(10*ms), cfg)
		if !a.Packet.Poll {
			t.Fatal("no poll")
		}
		if st := f.s.Status(); st.TxInterval != 100*ms {
			t.Fatalf("decrease not applied at once: %v", st.TxInterval)
		}
		if got := f.s.NextDeadline(); !got.Equal(at(110 * ms)) {
			t.Fatalf("next %v, want 110ms", got.Sub(t0))
		}
	})
	t.Run("rx decrease waits for final", func(t *testing.T) {
		f := newFixture(t, base)
		f.up(0)
		cfg := base
		cfg.RequiredMinRx = 100 * ms
		f.s.SetConfig(at(10*ms), cfg)
		if st := f.s.Status(); st.DetectionTime != 900*ms {
			t.Fatalf("detection shortened before Final: %v", st.DetectionTime)
		}
		f.rx(20*ms, remote(StateUp, withFinal))
		if st := f.s.Status(); st.DetectionTime != 300*ms {
			t.Fatalf("after Final: %v, want 300ms", st.DetectionTime)
		}
	})
	t.Run("rx increase applies at once", func(t *testing.T) {
		f := newFixture(t, base)
		f.up(0)
		cfg := base
		cfg.RequiredMinRx = 500 * ms
		f.s.SetConfig(at(10*ms), cfg)
		if st := f.s.Status(); st.DetectionTime != 1500*ms {
			t.Fatalf("detection %v, want 1.5s at once", st.DetectionTime)
		}
	})
	t.Run("change during poll waits for it", func(t *testing.T) {
		f := newFixture(t, base)
		f.up(0)
		c1, c2 := base, base
		c1.DesiredMinTx = 600 * ms
		c2.DesiredMinTx = 900 * ms
		f.s.SetConfig(at(10*ms), c1)
		a, _ := f.s.SetConfig(at(20*ms), c2)
		if a.Send {
			t.Fatalf("second poll started during the first: %+v", a.Packet)
		}
		if a := f.s.Tick(at(310 * ms)); a.Packet.DesiredMinTxInterval != 600_000 || !a.Packet.Poll {
			t.Fatalf("advertised value changed mid-poll: %+v", a.Packet)
		}
		a = f.rx(320*ms, remote(StateUp, withFinal))
		if !a.Send || !a.Packet.Poll || a.Packet.DesiredMinTxInterval != 900_000 {
			t.Fatalf("pending change must start a new poll after the Final: %+v", a.Packet)
		}
		if st := f.s.Status(); st.TxInterval != 600*ms {
			t.Fatalf("tx interval %v, want 600ms until the second Final", st.TxInterval)
		}
		f.rx(330*ms, remote(StateUp, withFinal))
		if st := f.s.Status(); st.TxInterval != 900*ms || st.PollInProgress {
			t.Fatalf("after second Final: %+v", st)
		}
	})
	t.Run("not up: no poll", func(t *testing.T) {
		f := newFixture(t, base)
		cfg := base
		cfg.RequiredMinRx = 100 * ms
		a, _ := f.s.SetConfig(at(10*ms), cfg)
		if a.Send || f.s.Status().PollInProgress || f.s.Status().LocalRequiredMinRx != 100*ms {
			t.Fatalf("actions %+v status %+v", a, f.s.Status())
		}
	})
	t.Run("invalid", func(t *testing.T) {
		f := newFixture(t, base)
		if _, err := f.s.SetConfig(t0, SessionConfig{}); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("down cancels poll", func(t *testing.T) {
		f := newFixture(t, base)
		f.rx(0, remote(StateDown))
		f.rx(0, remote(StateUp)) // poll running
		a := f.rx(10*ms, remote(StateDown))
		wantChange(t, a, StateUp, StateDown, DiagNeighborDown)
		if a.Packet.Poll || a.Packet.DesiredMinTxInterval != 1_000_000 || f.s.Status().TxInterval != time.Second {
			t.Fatalf("down packet %+v", a.Packet)
		}
	})
}

// FRR deletes and re-creates its session with a new discriminator; it then
// sends Down with YourDisc 0 from the new MyDisc.
func TestRelearnRemoteDiscriminator(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.up(0)
	a := f.rx(100*ms, remote(StateDown, withMy(remoteD2)))
	wantChange(t, a, StateUp, StateDown, DiagNeighborDown)
	if a.Packet.YourDiscriminator != remoteD2 {
		t.Fatalf("not re-learned: %+v", a.Packet)
	}
	a = f.rx(200*ms, remote(StateDown, withMy(remoteD2)))
	wantChange(t, a, StateDown, StateInit, DiagNone)
	a = f.rx(300*ms, remote(StateUp, withMy(remoteD2)))
	wantChange(t, a, StateInit, StateUp, DiagNone)
	if a.Packet.YourDiscriminator != remoteD2 {
		t.Fatalf("packet %+v", a.Packet)
	}
}

func TestAdminDownAndUp(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.up(0)
	a := f.s.SetAdminDown(at(10*ms), DiagAdminDown)
	wantChange(t, a, StateUp, StateAdminDown, DiagAdminDown)
	if a.Packet.YourDiscriminator != remoteD {
		t.Fatalf("AdminDown must reach the remote session: %+v", a.Packet)
	}
	if a := f.s.SetAdminDown(at(20*ms), DiagAdminDown); a.Send || a.StateChanged {
		t.Fatal("second SetAdminDown acted")
	}
	// Keeps telling the remote, at the slow rate.
	if got := f.s.NextDeadline(); got.Sub(t0) > 910*ms {
		// the detection timer of the last packet (900 ms) comes first
		t.Fatalf("next deadline %v", got.Sub(t0))
	}
	f.s.Tick(at(900 * ms)) // detection timer: no effect in AdminDown
	if f.s.State() != StateAdminDown {
		t.Fatal("left AdminDown")
	}
	a = f.s.Tick(at(1010 * ms))
	if !a.Send || a.Packet.State != StateAdminDown || a.Packet.Diag != DiagAdminDown || a.Packet.DesiredMinTxInterval != 1_000_000 {
		t.Fatalf("periodic AdminDown %+v", a)
	}
	a = f.s.SetAdminUp(at(2 * time.Second))
	wantChange(t, a, StateAdminDown, StateDown, DiagNone)
	if a := f.s.SetAdminUp(at(2 * time.Second)); a.Send {
		t.Fatal("SetAdminUp when not AdminDown acted")
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		cfg  SessionConfig
		want string
	}{
		{DefaultSessionConfig(), ""},
		{SessionConfig{DetectMult: 1, DesiredMinTx: 10 * ms, RequiredMinRx: 60 * time.Second}, ""},
		{SessionConfig{DetectMult: 0, DesiredMinTx: 300 * ms, RequiredMinRx: 300 * ms}, "VIPD_BFD_DETECT_MULT"},
		{SessionConfig{DetectMult: 256, DesiredMinTx: 300 * ms, RequiredMinRx: 300 * ms}, "1 to 255"},
		{SessionConfig{DetectMult: 3, DesiredMinTx: 9 * ms, RequiredMinRx: 300 * ms}, "VIPD_BFD_TX_INTERVAL"},
		{SessionConfig{DetectMult: 3, DesiredMinTx: 300 * ms, RequiredMinRx: 61 * time.Second}, "VIPD_BFD_RX_INTERVAL"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if tt.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tt.cfg, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: err %v, want mention of %q", tt.cfg, err, tt.want)
		}
	}
}

func TestStatusRemoteDetectionTime(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.up(0)
	st := f.s.Status()
	// FRR waits 3 (our mult) x max(its RX 100 ms, our TX 300 ms).
	if st.RemoteDetectionTime != 900*ms || st.RemoteDetectMult != 3 || st.RemoteDesiredMinTx != 100*ms {
		t.Fatalf("%+v", st)
	}
}

func TestStatusJSON(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.up(0)
	b, err := json.Marshal(PeerStatus{Peer: netip.MustParseAddr("192.0.2.1"), Session: f.s.Status()})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	sess, _ := got["session"].(map[string]any)
	if got["peer"] != "192.0.2.1" || sess["state"] != "up" || sess["tx_interval_ms"] != 300.0 ||
		sess["detection_time_ms"] != 900.0 || sess["remote_desired_min_tx_ms"] != 100.0 || sess["local_diag"] != "none" {
		t.Fatalf("JSON %s", b)
	}
	if _, ok := got["local"]; ok {
		t.Fatalf("zero local address should be omitted: %s", b)
	}
}

func TestTxResumesAfterSilentRemoteThatStoppedIt(t *testing.T) {
	f := newFixture(t, DefaultSessionConfig())
	f.s.Tick(t0)
	f.rx(10*ms, remote(StateAdminDown, withRx(0))) // remote: send nothing; we stay Down
	if next := f.s.NextDeadline(); !next.Equal(at(3010 * ms)) {
		t.Fatalf("only the detection timer should be left, next %v", next.Sub(t0))
	}
	a := f.s.Tick(at(3010 * ms)) // silence for a detection time: forget the remote
	wantNoChange(t, a)
	if next := f.s.NextDeadline(); next.IsZero() || next.After(at(4010*ms)) {
		t.Fatalf("periodic TX did not resume after the remote was forgotten: next %v", next)
	}
}

// BenchmarkSessionRx measures parse + state machine per received packet.
func BenchmarkSessionRx(b *testing.B) {
	s, err := NewSession(t0, localD, DefaultSessionConfig(), func() float64 { return 0.5 })
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range []*ControlPacket{remote(StateDown), remote(StateUp), remote(StateUp, withFinal)} {
		if _, err := s.Receive(t0, p); err != nil {
			b.Fatal(err)
		}
	}
	pkt := remote(StateUp)
	wire, _ := pkt.MarshalBinary()
	out := make([]byte, 0, ControlPacketLen)
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(100 * ms)
		var p ControlPacket
		if err := p.UnmarshalBinary(wire); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Receive(now, &p); err != nil {
			b.Fatal(err)
		}
		a := s.Tick(now)
		if a.Send {
			out, _ = a.Packet.AppendBinary(out[:0])
		}
	}
}
