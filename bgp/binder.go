package bgp

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// netlinkBinder binds VIPs as host addresses on one interface (lo) of the
// current network namespace.
type netlinkBinder struct {
	iface string
}

func (b netlinkBinder) addr(vip netip.Prefix) *netlink.Addr {
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

func (b netlinkBinder) link() (netlink.Link, error) {
	l, err := netlink.LinkByName(b.iface)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", b.iface, err)
	}
	return l, nil
}

func (b netlinkBinder) Bind(vip netip.Prefix) error {
	l, err := b.link()
	if err != nil {
		return err
	}
	if ok, err := b.Bound(vip); err != nil || ok {
		return err
	}
	if err := netlink.AddrAdd(l, b.addr(vip)); err != nil && !errors.Is(err, os.ErrExist) && !strings.Contains(err.Error(), "exists") {
		return err
	}
	return nil
}

func (b netlinkBinder) Unbind(vip netip.Prefix) error {
	l, err := b.link()
	if err != nil {
		return err
	}
	if ok, err := b.Bound(vip); err != nil || !ok {
		return err
	}
	if err := netlink.AddrDel(l, b.addr(vip)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return err
	}
	return nil
}

func (b netlinkBinder) Bound(vip netip.Prefix) (bool, error) {
	l, err := b.link()
	if err != nil {
		return false, err
	}
	fam := netlink.FAMILY_V4
	if vip.Addr().Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(l, fam)
	if err != nil {
		return false, fmt.Errorf("list addresses on %s: %w", b.iface, err)
	}
	for _, a := range addrs {
		got, ok := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		if ok && got.Unmap() == vip.Addr() && ones == vip.Bits() {
			return true, nil
		}
	}
	return false, nil
}
