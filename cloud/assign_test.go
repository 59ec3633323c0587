package cloud

import "testing"

func TestDecideLock(t *testing.T) {
	other := Holding{Holder: "2"}
	for _, tc := range []struct {
		name                    string
		h                       Holding
		explicit, waited, moved bool
		want                    lockStep
	}{
		{"DO 422, IP locked: wait", Holding{Holder: "2", Locked: true}, false, false, false, lockWait},
		{"locked beats everything, even here", Holding{Holder: "1", Self: true, Locked: true}, false, true, false, lockWait},
		{"the lock's action put it here: done", Holding{Holder: "1", Self: true}, true, true, true, lockDone},
		{"moved elsewhere while we waited: stop", other, false, true, true, lockMoved},
		{"moved elsewhere (Hetzner, lock unseen): stop", other, true, false, true, lockMoved},
		{"DO lock gone, nothing moved: assign", other, false, true, false, lockAssign},
		{"Hetzner 423 after a wait: assign", other, true, true, false, lockAssign},
		{"Hetzner 423, lock unseen: wait first", other, true, false, false, lockWait},
		{"DO 422, no lock at all: final", other, false, false, false, lockRefused},
		{"DO 422, unassigned, no lock: final", Holding{}, false, false, false, lockRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideLock(tc.h, tc.explicit, tc.waited, tc.moved); got != tc.want {
				t.Fatalf("decideLock = %v, want %v", got, tc.want)
			}
		})
	}
}
