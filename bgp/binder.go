package bgp

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// netlinkBinder binds VIPs as host addresses on one interface (lo) of the
// current network namespace.
//
// Bound answers from one address dump of the interface kept for
// snapshotTTL (and updated by Bind and Unbind): the driver asks about every
// VIP on each reconcile pass, and a dump per VIP made a pass over 2,000
// VIPs cost 2,000 dumps of 2,000 addresses. A VIP removed by someone else
// is noticed at most snapshotTTL later.
type netlinkBinder struct {
	iface string

	mu     sync.Mutex
	snap   map[netip.Prefix]bool
	snapAt time.Time
}

// snapshotTTL bounds how stale Bound's view of the interface may be.
const snapshotTTL = 250 * time.Millisecond

func newNetlinkBinder(iface string) *netlinkBinder { return &netlinkBinder{iface: iface} }

func (b *netlinkBinder) addr(vip netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: vip.Addr().AsSlice(), Mask: net.CIDRMask(vip.Bits(), vip.Addr().BitLen())}}
	// Valid forever, preferred for 0 s: the kernel accepts traffic for the
	// VIP but never picks it as a source address for the node's own
	// connections.
	a.ValidLft = math.MaxUint32
	a.PreferedLft = 0
	if vip.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

func (b *netlinkBinder) link() (netlink.Link, error) {
	l, err := netlink.LinkByName(b.iface)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", b.iface, err)
	}
	return l, nil
}

func (b *netlinkBinder) Bind(vip netip.Prefix) error {
	l, err := b.link()
	if err != nil {
		return err
	}
	if ok, err := b.Bound(vip); err != nil || ok {
		return err
	}
	if err := netlink.AddrAdd(l, b.addr(vip)); err != nil && !errors.Is(err, os.ErrExist) && !strings.Contains(err.Error(), "exists") {
		b.forget()
		return err
	}
	b.set(vip, true)
	return nil
}

func (b *netlinkBinder) Unbind(vip netip.Prefix) error {
	l, err := b.link()
	if err != nil {
		return err
	}
	if ok, err := b.Bound(vip); err != nil || !ok {
		return err
	}
	if err := netlink.AddrDel(l, b.addr(vip)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		b.forget()
		return err
	}
	b.set(vip, false)
	return nil
}

func (b *netlinkBinder) Bound(vip netip.Prefix) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.snap == nil || time.Since(b.snapAt) > snapshotTTL {
		l, err := b.link()
		if err != nil {
			return false, err
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return false, fmt.Errorf("list addresses on %s: %w", b.iface, err)
		}
		snap := make(map[netip.Prefix]bool, len(addrs))
		for _, a := range addrs {
			got, ok := netip.AddrFromSlice(a.IP)
			ones, _ := a.Mask.Size()
			if ok {
				snap[netip.PrefixFrom(got.Unmap(), ones)] = true
			}
		}
		b.snap, b.snapAt = snap, time.Now()
	}
	return b.snap[vip], nil
}

// set records a change this binder made in the snapshot.
func (b *netlinkBinder) set(vip netip.Prefix, bound bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.snap != nil {
		b.snap[vip] = bound
	}
}

// forget drops the snapshot after a failed change: the next Bound reads
// the kernel again.
func (b *netlinkBinder) forget() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.snap = nil
}

// UnbindLocal removes vip from iface as the speaker binds it (a host
// address, valid forever, preferred for 0 s) and reports whether it was
// there: `vipd cleanup` after a vipd that did not release it.
func UnbindLocal(iface string, vip netip.Prefix) (bool, error) {
	b := newNetlinkBinder(iface)
	ok, err := b.Bound(vip)
	if err != nil || !ok {
		return false, err
	}
	return true, b.Unbind(vip)
}
