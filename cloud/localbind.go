package cloud

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// LocalBinder optionally mirrors the cloud holder state on the node:
// Bind on Acquire, Unbind on Release. It is opt-in; the reserved IP works
// without it (DigitalOcean delivers reserved-IP traffic to the droplet's
// anchor IP).
type LocalBinder interface {
	Bind(ctx context.Context, vip netip.Prefix) error
	Unbind(ctx context.Context, vip netip.Prefix) error
	Bound(vip netip.Prefix) (bool, error)
	Close() error
}

// LinkBinder binds the VIP as a /32 on one interface (usually lo) with
// preferred lifetime 0, so local programs can bind to or reach the reserved
// IP while the kernel never picks it as a source address.
type LinkBinder struct {
	link string
	h    *netlink.Handle
}

// NewLinkBinder binds on the named interface in the current network
// namespace.
func NewLinkBinder(link string) (*LinkBinder, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &LinkBinder{link: link, h: h}, nil
}

// NewLinkBinderAt binds on the named interface in the given namespace.
func NewLinkBinderAt(link string, ns netns.NsHandle) (*LinkBinder, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &LinkBinder{link: link, h: h}, nil
}

func (b *LinkBinder) addr(vip netip.Prefix) *netlink.Addr {
	return &netlink.Addr{
		IPNet:       &net.IPNet{IP: net.IP(vip.Addr().AsSlice()), Mask: net.CIDRMask(vip.Addr().BitLen(), vip.Addr().BitLen())},
		PreferedLft: 0,
		ValidLft:    math.MaxUint32, // forever
	}
}

func (b *LinkBinder) linkByName() (netlink.Link, error) {
	l, err := b.h.LinkByName(b.link)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", b.link, err)
	}
	return l, nil
}

// Bind adds the address (idempotent).
func (b *LinkBinder) Bind(_ context.Context, vip netip.Prefix) error {
	l, err := b.linkByName()
	if err != nil {
		return err
	}
	if err := b.h.AddrReplace(l, b.addr(vip)); err != nil {
		return fmt.Errorf("add %s to %s: %w", vip.Addr(), b.link, err)
	}
	return nil
}

// Unbind removes the address; a missing address is not an error.
func (b *LinkBinder) Unbind(_ context.Context, vip netip.Prefix) error {
	l, err := b.linkByName()
	if err != nil {
		return err
	}
	if err := b.h.AddrDel(l, b.addr(vip)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("remove %s from %s: %w", vip.Addr(), b.link, err)
	}
	return nil
}

// Bound reports whether the address is on the interface.
func (b *LinkBinder) Bound(vip netip.Prefix) (bool, error) {
	l, err := b.linkByName()
	if err != nil {
		return false, err
	}
	addrs, err := b.h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return false, fmt.Errorf("list addresses on %s: %w", b.link, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == vip.Addr() {
			return true, nil
		}
	}
	return false, nil
}

// Close releases the netlink handle (the address stays).
func (b *LinkBinder) Close() error {
	b.h.Close()
	return nil
}
