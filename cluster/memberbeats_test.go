package cluster

import (
	"fmt"
	"hash/fnv"
	"slices"
	"testing"
	"time"
)

// beatRun drives a MemberBeats on node "a" over grid ticks: at tick k the
// beats read are in(k); it returns the ticks at which each verdict was
// reported ("k:b+" silent, "k:b-" heard again) and the relay list of the
// last tick.
func beatRun(t *testing.T, watch []string, ticks int, in func(k int) []BeatIn) (verdicts []string, last []BeatHeard) {
	t.Helper()
	cfg := HeartbeatConfig{Interval: 250 * time.Millisecond, Misses: 3, Members: true}
	m := NewMemberBeats(cfg, "")
	t0 := time.Unix(1000, 0)
	var bm []BeatMember
	for _, n := range watch {
		bm = append(bm, BeatMember{Name: n})
	}
	m.Watch(bm, t0)
	for k := 1; k <= ticks; k++ {
		now := t0.Add(time.Duration(k) * cfg.Interval)
		tk := m.Tick(now, in(k))
		for _, ev := range tk.Events {
			s := "-"
			if ev.Silent {
				s = "+"
			}
			verdicts = append(verdicts, fmt.Sprintf("%d:%s%s", k, ev.Name, s))
		}
		last = tk.Heard
	}
	return verdicts, last
}

func beat(name string, heard ...BeatHeard) BeatIn { return BeatIn{Name: name, Heard: heard} }

func rel(name string, age uint8) BeatHeard { return BeatHeard{Hash: BeatHash(name), Age: age} }

func TestMemberBeatsTracker(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   func(k int) []BeatIn
		want []string
	}{
		{
			name: "steady beats: nobody silent",
			in:   func(int) []BeatIn { return []BeatIn{beat("b"), beat("c")} },
		},
		{
			// b's last beat is read at tick 4: silent at tick 7 (3 x 250 ms
			// later), heard again at tick 10.
			name: "a member stops and comes back",
			in: func(k int) []BeatIn {
				if k > 4 && k < 10 {
					return []BeatIn{beat("c")}
				}
				return []BeatIn{beat("b"), beat("c")}
			},
			want: []string{"7:b+", "10:b-"},
		},
		{
			name: "two lost beats in a row are allowed, three are not",
			in: func(k int) []BeatIn {
				if k == 3 || k == 4 || (k >= 8 && k <= 10) {
					return []BeatIn{beat("c")}
				}
				return []BeatIn{beat("b"), beat("c")}
			},
			want: []string{"10:b+", "11:b-"},
		},
		{
			// a and b lost their link; c reads b every tick and says so.
			name: "a relay keeps a member with a lost direct link alive",
			in: func(k int) []BeatIn {
				return []BeatIn{beat("c", rel("b", 0))}
			},
		},
		{
			name: "relays alone, one lost: still alive",
			in: func(k int) []BeatIn {
				if k == 5 {
					return nil
				}
				return []BeatIn{beat("c", rel("b", 0))}
			},
		},
		{
			// A relay of age 1 counts as read two intervals ago: alone it
			// keeps b alive, with no loss to spare; when c stops, b is
			// silent one interval before c.
			name: "relays of age 1 alone",
			in: func(k int) []BeatIn {
				if k >= 6 {
					return nil
				}
				return []BeatIn{beat("c", rel("b", 1))}
			},
			want: []string{"6:b+", "8:c+"},
		},
		{
			// The holder b dies after its beat read at tick 4: c read the
			// same beat, and relays it with age 0 at tick 5 and age 1 at
			// tick 6. The relays are never fresher than the direct read:
			// b is silent at tick 7 as without them.
			name: "relays do not delay the verdict on a member nobody hears",
			in: func(k int) []BeatIn {
				switch {
				case k <= 4:
					return []BeatIn{beat("b", rel("c", 0)), beat("c", rel("b", 0))}
				case k == 5:
					return []BeatIn{beat("c", rel("b", 0))}
				case k == 6:
					return []BeatIn{beat("c", rel("b", 1))}
				}
				return []BeatIn{beat("c")}
			},
			want: []string{"7:b+"},
		},
		{
			name: "relays older than two ticks, about the sender itself or from an unwatched sender are ignored",
			in: func(k int) []BeatIn {
				return []BeatIn{beat("c", rel("b", 2), rel("c", 0)), beat("x", rel("b", 0))}
			},
			want: []string{"3:b+"},
		},
		{
			name: "a relay about this node itself is ignored",
			in: func(k int) []BeatIn {
				return []BeatIn{beat("b", rel("a", 0)), beat("c", rel("a", 0))}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := beatRun(t, []string{"b", "c"}, 14, tc.in)
			if !slices.Equal(got, tc.want) {
				t.Errorf("verdicts %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMemberBeatsRelayList(t *testing.T) {
	// b read at every tick, c last at tick 9 of 10, d at tick 8 (too old).
	_, heard := beatRun(t, []string{"b", "c", "d"}, 10, func(k int) []BeatIn {
		in := []BeatIn{beat("b")}
		if k <= 9 {
			in = append(in, beat("c"))
		}
		if k <= 8 {
			in = append(in, beat("d"))
		}
		return in
	})
	want := []BeatHeard{rel("b", 0), rel("c", 1)}
	if !slices.Equal(heard, want) {
		t.Errorf("relay list %v, want %v (b age 0, c age 1, not d)", heard, want)
	}
	// A member never heard is never relayed.
	_, heard = beatRun(t, []string{"b"}, 2, func(int) []BeatIn { return nil })
	if len(heard) != 0 {
		t.Errorf("relay list %v for a member never heard", heard)
	}
}

func TestMemberBeatsStalledAndWatch(t *testing.T) {
	cfg := HeartbeatConfig{Interval: 250 * time.Millisecond, Misses: 3, Members: true}
	m := NewMemberBeats(cfg, "")
	t0 := time.Unix(1000, 0)
	m.Watch([]BeatMember{{Name: "b"}}, t0)
	iv := cfg.Interval
	if evs := m.Tick(t0.Add(iv), []BeatIn{beat("b")}).Events; len(evs) != 0 {
		t.Fatalf("tick 1: %v", evs)
	}
	// This node's own timer fires 2 s late: b's beats of that time wait
	// unread, so b is not found silent on this late tick.
	if evs := m.Tick(t0.Add(2*iv+2*time.Second), nil).Events; len(evs) != 0 {
		t.Fatalf("late tick reported %v", evs)
	}
	// Still nothing from b an interval later: now it is silent.
	if evs := m.Tick(t0.Add(3*iv+2*time.Second), nil).Events; !slices.Equal(evs, []HolderSilent{{Name: "b", Silent: true}}) {
		t.Fatalf("tick after the stall: %v, want b silent", evs)
	}
	// b leaves the view: the verdict is withdrawn; back in view, it gets
	// a full deadline.
	now := t0.Add(4*iv + 2*time.Second)
	if evs := m.Watch(nil, now); !slices.Equal(evs, []HolderSilent{{Name: "b", Silent: false}}) {
		t.Fatalf("unwatch: %v", evs)
	}
	m.Watch([]BeatMember{{Name: "b"}}, now)
	for k := 1; k < cfg.Misses; k++ {
		if evs := m.Tick(now.Add(time.Duration(k)*iv), nil).Events; len(evs) != 0 {
			t.Fatalf("re-watched member reported %v after %d ticks", evs, k)
		}
	}
	if got := m.Silent(); len(got) != 0 {
		t.Fatalf("silent %v", got)
	}
}

// TestMemberBeatsPull: a beat that carries other metadata than the view
// has of its sender asks for a pull (again every 8 more while they
// disagree); a view that catches up, a beat that agrees or carries no
// hash, resets the count.
func TestMemberBeatsPull(t *testing.T) {
	cfg := HeartbeatConfig{Interval: 250 * time.Millisecond, Misses: 3, Members: true}
	m := NewMemberBeats(cfg, "")
	t0 := time.Unix(1000, 0)
	m.Watch([]BeatMember{{Name: "b", Meta: 10}, {Name: "c", Meta: 20}}, t0)
	var pulls []string
	tick := func(k int, in ...BeatIn) {
		for _, n := range m.Tick(t0.Add(time.Duration(k)*cfg.Interval), in).Pull {
			pulls = append(pulls, fmt.Sprintf("%d:%s", k, n))
		}
	}
	b := func(name string, meta uint32) BeatIn { return BeatIn{Name: name, Meta: meta} }
	tick(1, b("b", 10), b("c", 20))
	tick(2, b("b", 11), b("c", 20)) // b changed and its push was lost: pull b
	tick(3, b("b", 11), b("c", 0))  // c carries none
	for k := 4; k <= 12; k++ {
		tick(k, b("b", 11), b("c", 21)) // c changed at 4: pull c; again 8 beats later
	}
	m.Watch([]BeatMember{{Name: "b", Meta: 11}, {Name: "c", Meta: 20}}, t0.Add(13*cfg.Interval)) // b caught up
	tick(13, b("b", 11), b("c", 20))                                                             // c agrees again: reset
	tick(14, b("b", 11), b("c", 21))
	want := []string{"2:b", "4:c", "10:b", "12:c", "14:c"}
	if !slices.Equal(pulls, want) {
		t.Errorf("pulls %v, want %v", pulls, want)
	}
}

// TestBeatHashIsFNV: BeatHash is FNV-1a 64 (members of older and newer
// versions must agree on it).
// TestMemberBeatsRelayPull: a member heard only through relays (its
// link to this node is down) changed its metadata and neither its push
// nor a pull can reach this node; a relay that carries the newer hash
// makes this node pull from the relaying member, which has it. A member
// heard directly speaks for itself, a relay that agrees or carries no
// hash does nothing, and the pull repeats every 8 ticks while relays
// disagree.
func TestMemberBeatsRelayPull(t *testing.T) {
	cfg := HeartbeatConfig{Interval: 250 * time.Millisecond, Misses: 3, Members: true}
	rm := func(name string, meta uint32) BeatHeard { return BeatHeard{Hash: BeatHash(name), Meta: meta} }
	bt := func(name string, meta uint32, heard ...BeatHeard) BeatIn {
		return BeatIn{Name: name, Meta: meta, Heard: heard}
	}
	for _, tc := range []struct {
		name string
		in   func(k int) []BeatIn
		want []string
	}{
		{
			name: "relays agree: no pull",
			in: func(int) []BeatIn {
				return []BeatIn{bt("c", 20, rm("b", 10)), bt("d", 30, rm("b", 10))}
			},
		},
		{
			name: "b unreachable, c relays b's newer metadata: pull from c, again every 8 ticks",
			in: func(k int) []BeatIn {
				return []BeatIn{bt("c", 20, rm("b", 11)), bt("d", 30, rm("b", 10))}
			},
			want: []string{"1:c", "9:c"},
		},
		{
			name: "the first disagreeing relay in read order is asked",
			in: func(k int) []BeatIn {
				return []BeatIn{bt("d", 30, rm("b", 11)), bt("c", 20, rm("b", 11))}
			},
			want: []string{"1:d", "9:d"},
		},
		{
			name: "b heard directly with the view's metadata: a stale relay is ignored",
			in: func(k int) []BeatIn {
				return []BeatIn{bt("b", 10), bt("c", 20, rm("b", 9))}
			},
		},
		{
			name: "b heard directly with newer metadata: pull from b, not the relay",
			in: func(k int) []BeatIn {
				return []BeatIn{bt("b", 11), bt("c", 20, rm("b", 11))}
			},
			want: []string{"1:b", "9:b"},
		},
		{
			// b's beat read at tick 1 agreed; relays disagree from then
			// on: b counts as heard directly up to two ticks after.
			name: "b heard directly lately: relays disagree only after two ticks",
			in: func(k int) []BeatIn {
				if k == 1 {
					return []BeatIn{bt("b", 10), bt("c", 20, rm("b", 10))}
				}
				return []BeatIn{bt("c", 20, rm("b", 11))}
			},
			want: []string{"4:c", "12:c"},
		},
		{
			name: "a relay without a hash (unknown to the relay) does nothing",
			in: func(k int) []BeatIn {
				return []BeatIn{bt("c", 20, rm("b", 0))}
			},
		},
		{
			name: "disagreement stops, then starts again: counted afresh",
			in: func(k int) []BeatIn {
				if k == 3 {
					return []BeatIn{bt("c", 20, rm("b", 10))}
				}
				if k > 5 {
					return nil
				}
				return []BeatIn{bt("c", 20, rm("b", 11))}
			},
			want: []string{"1:c", "4:c"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMemberBeats(cfg, "")
			t0 := time.Unix(1000, 0)
			m.Watch([]BeatMember{{Name: "b", Meta: 10}, {Name: "c", Meta: 20}, {Name: "d", Meta: 30}}, t0)
			var pulls []string
			for k := 1; k <= 12; k++ {
				for _, n := range m.Tick(t0.Add(time.Duration(k)*cfg.Interval), tc.in(k)).Pull {
					pulls = append(pulls, fmt.Sprintf("%d:%s", k, n))
				}
			}
			if !slices.Equal(pulls, tc.want) {
				t.Errorf("pulls %v, want %v", pulls, tc.want)
			}
		})
	}
	// The relay list carries this node's view of each member's metadata.
	m := NewMemberBeats(cfg, "")
	t0 := time.Unix(1000, 0)
	m.Watch([]BeatMember{{Name: "b", Meta: 10}, {Name: "c", Meta: 20}}, t0)
	tk := m.Tick(t0.Add(cfg.Interval), []BeatIn{bt("b", 10), bt("c", 20)})
	if want := []BeatHeard{{Hash: BeatHash("b"), Meta: 10}, {Hash: BeatHash("c"), Meta: 20}}; !slices.Equal(tk.Heard, want) {
		t.Errorf("relay list %v, want %v", tk.Heard, want)
	}
}

// TestMemberBeatsUnheard: a node whose beats no member lists (its packets
// do not get out; it still reads everyone's) takes every member as silent
// after twice the deadline, so it loses its quorum instead of keeping it on
// one-way evidence; when a member lists it again, they are heard again.
// Relay ages count as for any relay.
func TestMemberBeatsUnheard(t *testing.T) {
	cfg := HeartbeatConfig{Interval: 250 * time.Millisecond, Misses: 3, Members: true}
	for _, tc := range []struct {
		name string
		in   func(k int) []BeatIn
		want []string
	}{
		{
			name: "b and c read a's beats: nobody silent",
			in: func(int) []BeatIn {
				return []BeatIn{beat("b", rel("a", 0)), beat("c", rel("a", 1))}
			},
		},
		{
			name: "only b reads a's beats: enough (c hears of a through b)",
			in:   func(int) []BeatIn { return []BeatIn{beat("b", rel("a", 0)), beat("c")} },
		},
		{
			// a's last listing is read at tick 4 (age 0: a beat read at
			// tick 3): silent at tick 9 (twice the deadline), listed
			// again at tick 11.
			name: "a's beats stop getting out, then get out again",
			in: func(k int) []BeatIn {
				if k > 4 && k < 11 {
					return []BeatIn{beat("b"), beat("c")}
				}
				return []BeatIn{beat("b", rel("a", 0)), beat("c", rel("a", 0))}
			},
			want: []string{"9:b+", "9:c+", "11:b-", "11:c-"},
		},
		{
			// Watching began at tick 0: twice the deadline to be heard.
			name: "never listed",
			in:   func(int) []BeatIn { return []BeatIn{beat("b"), beat("c")} },
			want: []string{"6:b+", "6:c+"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMemberBeats(cfg, "a")
			t0 := time.Unix(1000, 0)
			m.Watch([]BeatMember{{Name: "b"}, {Name: "c"}}, t0)
			var got []string
			for k := 1; k <= 12; k++ {
				for _, ev := range m.Tick(t0.Add(time.Duration(k)*cfg.Interval), tc.in(k)).Events {
					s := "-"
					if ev.Silent {
						s = "+"
					}
					got = append(got, fmt.Sprintf("%d:%s%s", k, ev.Name, s))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("verdicts %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBeatHashIsFNV(t *testing.T) {
	for _, n := range []string{"", "cp-1", "a-rather-long-node-name.example.org"} {
		h := fnv.New64a()
		h.Write([]byte(n))
		if got, want := BeatHash(n), h.Sum64(); got != want {
			t.Errorf("BeatHash(%q) = %x, want %x", n, got, want)
		}
	}
}

// TestBeatTickAllocs: a steady tick (read two beats, decide, sign one)
// allocates only the senders' names: what an idle node allocates is what
// it later collects.
func TestBeatTickAllocs(t *testing.T) {
	keys := beatKeys([][]byte{make([]byte, 32)})
	c := newBeatCodec(keys)
	cfg := HeartbeatConfig{Interval: 250 * time.Millisecond, Misses: 3, Members: true}
	m := NewMemberBeats(cfg, "")
	now := time.Unix(1000, 0)
	m.Watch([]BeatMember{{Name: "cp-2", Meta: 5}, {Name: "cp-3", Meta: 6}}, now)
	p2, _ := encodeBeat(beatMsg{Name: "cp-2", Seq: 1, Meta: 5, Heard: []BeatHeard{{BeatHash("cp-1"), 0, 4}, {BeatHash("cp-3"), 0, 6}}}, keys)
	p3, _ := encodeBeat(beatMsg{Name: "cp-3", Seq: 1, Meta: 6, Heard: []BeatHeard{{BeatHash("cp-1"), 0, 4}, {BeatHash("cp-2"), 0, 5}}}, keys)
	msgs := make([]beatMsg, 2)
	var in []BeatIn
	allocs := testing.AllocsPerRun(100, func() {
		now = now.Add(cfg.Interval)
		in = in[:0]
		for i, p := range [][]byte{p2, p3} {
			if err := c.decode(p, &msgs[i]); err != nil {
				t.Fatal(err)
			}
			in = append(in, BeatIn{Name: msgs[i].Name, Meta: msgs[i].Meta, Heard: msgs[i].Heard})
		}
		tk := m.Tick(now, in)
		if _, err := c.encode(beatMsg{Name: "cp-1", Seq: 1, Meta: 4, Heard: tk.Heard}); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Errorf("%.0f allocations a tick, want at most 2 (the senders' names)", allocs)
	}
}
