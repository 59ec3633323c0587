package lease

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"
)

// TestMetaEqualEveryEncodedField: metaBytes reuses its last encoding
// while meta.equal holds, so equal must see a change of every field the
// encoding carries (a field added to meta and not to equal fails here).
func TestMetaEqualEveryEncodedField(t *testing.T) {
	base := meta{V: metaVersion}
	rt := reflect.TypeOf(base)
	for i := range rt.NumField() {
		f := rt.Field(i)
		t.Run(f.Name, func(t *testing.T) {
			changed := base
			v := reflect.ValueOf(&changed).Elem().Field(i)
			switch v.Kind() {
			case reflect.String:
				v.SetString("x")
			case reflect.Bool:
				v.SetBool(true)
			case reflect.Int, reflect.Int64:
				v.SetInt(3)
			case reflect.Uint64, reflect.Uint8, reflect.Uint:
				v.SetUint(3)
			case reflect.Slice:
				v.Set(reflect.ValueOf([]string{"x"}))
			default:
				t.Fatalf("field %s of kind %v: teach this test", f.Name, v.Kind())
			}
			a, _ := json.Marshal(base)
			b, _ := json.Marshal(changed)
			encoded := string(a) != string(b)
			if base.equal(changed) == encoded {
				t.Errorf("equal %v for a change of %s that the encoding %s", base.equal(changed), f.Name,
					map[bool]string{true: "carries", false: "does not carry"}[encoded])
			}
		})
	}
}

// TestMetaBytesMemo: the memo returns the same encoding while nothing
// changed and a new one when something did.
func TestMetaBytesMemo(t *testing.T) {
	m := &Machine{cfg: Config{Name: "a", Role: Voter, Priority: 1}}
	first := string(m.metaBytes())
	if again := string(m.metaBytes()); again != first {
		t.Fatalf("same state encoded %s, then %s", first, again)
	}
	m.cfg.Priority = 2
	if changed := string(m.metaBytes()); changed == first {
		t.Fatalf("a priority change kept the encoding %s", changed)
	}
	md, ok := parseMeta(m.metaBytes())
	if !ok || md.Priority != 2 {
		t.Fatalf("parsed %+v, %v", md, ok)
	}
}

// TestVoterSumWire: the voters' hash in the metadata is compared between
// nodes of different releases (a rolling upgrade), so it must stay the
// FNV-64a of the sorted ids written as "%d," each; and the caller's slice
// keeps its order.
func TestVoterSumWire(t *testing.T) {
	for _, voters := range [][]uint64{nil, {7}, {9, 3, 5}, {1 << 63, 42, 18446744073709551615}, {2, 2, 1}} {
		in := slices.Clone(voters)
		sorted := slices.Sorted(slices.Values(voters))
		h := fnv.New64a()
		for _, v := range sorted {
			fmt.Fprintf(h, "%d,", v)
		}
		var scratch []uint64
		if got := voterSum(voters, &scratch); got != h.Sum64() {
			t.Errorf("voters %v: sum %x, want %x", voters, got, h.Sum64())
		}
		if !slices.Equal(in, voters) {
			t.Errorf("voterSum reordered its input: %v, was %v", voters, in)
		}
	}
}

// TestHeldMemoIsCurrent: after every step of a cluster's life (bootstrap,
// joins, a holder's loss, a restart), Status and the metadata's claims
// see the holds the step computed, exactly what a fresh computation gives.
func TestHeldMemoIsCurrent(t *testing.T) {
	n := three(t)
	checks := 0
	n.seen = func(name string, out Output) {
		m := n.nodes[name].m
		fresh := m.holds()
		if !maps.EqualFunc(out.Holds, fresh, time.Time.Equal) || !maps.EqualFunc(m.Status().Holds, fresh, time.Time.Equal) {
			t.Fatalf("%s at %v: output holds %v, status %v, fresh %v", name, n.now, out.Holds, m.Status().Holds, fresh)
		}
		var claims []string
		for _, a := range m.want {
			if _, ok := fresh[a.Key]; ok && a.Kind == ControlPlane {
				claims = append(claims, a.Key)
			}
		}
		slices.Sort(claims)
		if got := m.oldClaims(); !slices.Equal(got, claims) {
			t.Fatalf("%s at %v: the metadata claims %v, fresh holds give %v", name, n.now, got, claims)
		}
		checks++
	}
	n.run(time.Second)
	h := n.holders("vip")
	if len(h) != 1 {
		t.Fatalf("holders %v", h)
	}
	n.nodes[h[0]].up = false
	n.run(3 * time.Second)
	n.nodes[h[0]].up = true
	n.restart(h[0], true)
	n.view()
	n.run(2 * time.Second)
	if checks < 1000 {
		t.Fatalf("only %d steps checked", checks)
	}
}

// TestLeaderStepGarbage: a steady leader's step and the Status its loop
// reads after it stay within a small allocation budget. Before the memo
// of holds and the lazy raft status, a tick and its Status allocated 55
// times; before the placement's key was compared field by field, 32;
// before the pass over the reports was skipped when nobody reports, 21;
// before an empty exclusion list was sorted without sort.Slice, 19.
func TestLeaderStepGarbage(t *testing.T) {
	n := three(t)
	n.run(2 * time.Second)
	a := n.nodes["a"].m
	if a.lead == nil {
		t.Fatal("a is not the leader")
	}
	allocs := testing.AllocsPerRun(200, func() {
		n.now = n.now.Add(time.Millisecond)
		a.Step(n.now, Tick{})
		_ = a.Status()
	})
	n.q = nil
	t.Logf("%.1f allocations per leader tick and status", allocs)
	if allocs > 21 {
		t.Errorf("%.1f allocations per leader tick and status, want <= 21", allocs)
	}
}

// TestRenewalContextWire: the ctx of a renewal travels in the heartbeats
// and comes back in the voters' answers, also from nodes of the previous
// release during a rolling upgrade: it stays "term/seq" in decimal.
func TestRenewalContextWire(t *testing.T) {
	n := three(t)
	n.run(2 * time.Second)
	a := n.nodes["a"].m
	if a.lead == nil {
		t.Fatal("a is not the leader")
	}
	for _, seq := range []uint64{0, 9, 1 << 40, 18446744073709551614} {
		a.readSeq = seq
		a.renew()
		want := fmt.Sprintf("%d/%d", a.rn.BasicStatus().GetTerm(), seq+1)
		if _, ok := a.reads[want]; !ok {
			t.Fatalf("after a renewal with seq %d: reads %q, want the key %q", seq+1, slices.Collect(maps.Keys(a.reads)), want)
		}
	}
}

// TestPlaceKey: any change of what decides a placement is a change; a
// nil and an empty list are the same; a kept key does not share the
// pass's slices.
func TestPlaceKey(t *testing.T) {
	base := placeKey{elig: []string{"a", "b"}, poolCands: []string{"a"}, legacy: []string{"k"}, cp: "a", unv: "x", wantGen: 3}
	for _, tc := range []struct {
		name  string
		edit  func(k *placeKey)
		equal bool
	}{
		{"same", func(k *placeKey) {}, true},
		{"eligible node added", func(k *placeKey) { k.elig = append(k.elig, "c") }, false},
		{"eligible node renamed", func(k *placeKey) { k.elig = []string{"a", "c"} }, false},
		{"pool candidates", func(k *placeKey) { k.poolCands = []string{"a", "b"} }, false},
		{"legacy claims", func(k *placeKey) { k.legacy = nil }, false},
		{"control-plane holder", func(k *placeKey) { k.cp = "b" }, false},
		{"exclusions", func(k *placeKey) { k.unv = "" }, false},
		{"wanted addresses", func(k *placeKey) { k.wantGen++ }, false},
		{"list split differently", func(k *placeKey) { k.elig, k.poolCands = []string{"a"}, []string{"b", "a"} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := base.clone()
			tc.edit(&k)
			if got := k.equal(&base); got != tc.equal {
				t.Fatalf("equal = %v, want %v (%+v against %+v)", got, tc.equal, k, base)
			}
		})
	}
	empty, none := placeKey{elig: []string{}}, placeKey{}
	if !empty.equal(&none) {
		t.Error("an empty list differs from none")
	}
	kept := base.clone()
	base.elig[0] = "z"
	if kept.elig[0] != "a" {
		t.Error("the kept key shares the pass's slice")
	}
}
