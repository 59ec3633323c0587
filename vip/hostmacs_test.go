package vip

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

func TestHostMACs(t *testing.T) {
	eth0 := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	eth1 := net.HardwareAddr{2, 0, 0, 0, 0, 2}
	slave := net.HardwareAddr{2, 0, 0, 0, 0, 3} // permanent MAC of a bond slave
	other := net.HardwareAddr{2, 0, 0, 0, 0, 9}
	links := []netlink.Link{
		&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "eth0", HardwareAddr: eth0}},
		&netlink.Bond{LinkAttrs: netlink.LinkAttrs{Name: "bond0", HardwareAddr: eth0}},
		&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "eth2", HardwareAddr: eth0, PermHWAddr: slave}},
		&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo", HardwareAddr: net.HardwareAddr{0, 0, 0, 0, 0, 0}}},
	}
	lists := 0
	var fail error
	h := newHostMACs()
	h.list = func() ([]netlink.Link, error) {
		lists++
		return links, fail
	}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		name  string
		do    func()
		mac   net.HardwareAddr
		at    time.Duration
		own   bool
		err   bool
		lists int
	}{
		{name: "first lookup lists the links", mac: eth0, own: true, lists: 1},
		{name: "a bond slave's permanent MAC is ours", mac: slave, own: true, lists: 1},
		{name: "a foreign MAC within max age: no new listing", mac: other, at: 500 * time.Millisecond, lists: 1},
		{name: "a zero MAC (lo) is nobody's", mac: net.HardwareAddr{0, 0, 0, 0, 0, 0}, at: 600 * time.Millisecond, lists: 1},
		{name: "a NIC added: the link watch marks the set stale", do: func() {
			links = append(links, &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "eth1", HardwareAddr: eth1}})
			h.invalidate()
		}, mac: eth1, at: 700 * time.Millisecond, own: true, lists: 2},
		{name: "a foreign MAC again just within max age: no listing", mac: other, at: 700*time.Millisecond + hostMACsMaxAge - time.Millisecond, lists: 2},
		{name: "older than max age: listed again on a miss", mac: other, at: 700*time.Millisecond + hostMACsMaxAge, lists: 3},
		{name: "a hit needs no listing", mac: eth1, at: 3 * hostMACsMaxAge, own: true, lists: 3},
		{name: "a NIC removed and the set stale: no longer ours", do: func() {
			links = links[:len(links)-1]
			h.invalidate()
		}, mac: eth1, at: 3*hostMACsMaxAge + time.Millisecond, lists: 4},
		{name: "listing fails: an error, never a verdict", do: func() {
			fail = errors.New("netlink: boom")
			h.invalidate()
		}, mac: other, at: 3*hostMACsMaxAge + 2*time.Millisecond, err: true, lists: 5},
		{name: "the watch subscribes: listed again at the next miss", do: func() {
			fail = nil
			h.watching(true)
		}, mac: other, at: 4 * hostMACsMaxAge, lists: 6},
		{name: "watched: a foreign MAC past the unwatched max age needs no listing", mac: other, at: 6 * hostMACsMaxAge, lists: 6},
		{name: "watched: a link change still marks the set stale", do: func() {
			links = append(links, &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "eth1", HardwareAddr: eth1}})
			h.invalidate()
		}, mac: eth1, at: 6*hostMACsMaxAge + time.Millisecond, own: true, lists: 7},
		{name: "watched: just within the watched max age, no listing", mac: other, at: 6*hostMACsMaxAge + time.Millisecond + hostMACsWatchedMaxAge - time.Millisecond, lists: 7},
		{name: "watched: older than the watched max age, listed again", mac: other, at: 6*hostMACsMaxAge + time.Millisecond + hostMACsWatchedMaxAge, lists: 8},
		{name: "the watch stops: listed again at the next miss", do: func() {
			h.watching(false)
		}, mac: other, at: 6*hostMACsMaxAge + time.Millisecond + hostMACsWatchedMaxAge + time.Millisecond, lists: 9},
		{name: "unwatched again: the short max age applies", mac: other, at: 6*hostMACsMaxAge + 2*time.Millisecond + hostMACsWatchedMaxAge + hostMACsMaxAge, lists: 10},
	}
	for _, s := range steps {
		if s.do != nil {
			s.do()
		}
		own, err := h.own(s.mac, t0.Add(s.at))
		if own != s.own || (err != nil) != s.err || lists != s.lists {
			t.Fatalf("%s: own(%s) = %v, %v after %d listings; want %v, error %v, %d listings", s.name, s.mac, own, err, lists, s.own, s.err, s.lists)
		}
	}
}
