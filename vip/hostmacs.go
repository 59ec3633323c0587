package vip

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// hostMACsMaxAge is how old the set of this host's MACs may be when a MAC
// not in it is looked up: older, the links are listed again first. The
// netlink watch marks the set stale on every link change, so this only
// matters while that watch is down; it bounds the netlink dumps that the
// holder's answers to the verification rounds (a foreign MAC every
// second) and a host flooding claims can cause.
const hostMACsMaxAge = 10 * time.Second

// hostMACs is the set of this host's own link-layer addresses: every
// interface of the network namespace (bonds, their slaves' permanent
// addresses, VLANs, bridges, veths), so that an answer from one of them is
// never taken for another holder. Linux answers ARP for any local address
// on every interface (arp_ignore 0), so a second interface on the VIP's
// segment answers the holder's own probe.
//
// The set is listed lazily: when a MAC not in it is looked up and the set
// is stale (a link changed, see invalidate) or older than hostMACsMaxAge.
type hostMACs struct {
	list func() ([]netlink.Link, error) // netlink.LinkList; tests replace it

	mu    sync.Mutex
	set   map[string]bool
	read  time.Time
	stale bool
}

func newHostMACs() *hostMACs { return &hostMACs{list: netlink.LinkList, stale: true} }

// invalidate marks the set stale: a link was added, changed or removed.
func (h *hostMACs) invalidate() {
	h.mu.Lock()
	h.stale = true
	h.mu.Unlock()
}

// own reports whether mac belongs to an interface of this host. An error
// listing the links is returned with false: the caller must not take the
// MAC for another host's on that basis alone.
func (h *hostMACs) own(mac net.HardwareAddr, now time.Time) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.set[string(mac)] && !h.stale {
		return true, nil
	}
	if !h.stale && now.Sub(h.read) < hostMACsMaxAge && h.set != nil {
		return false, nil
	}
	links, err := h.list()
	if err != nil {
		return false, fmt.Errorf("list this host's interfaces: %w", err)
	}
	set := make(map[string]bool, 2*len(links))
	for _, l := range links {
		a := l.Attrs()
		for _, m := range []net.HardwareAddr{a.HardwareAddr, a.PermHWAddr} {
			if len(m) > 0 && !isZeroMAC(m) {
				set[string(m)] = true
			}
		}
	}
	h.set, h.read, h.stale = set, now, false
	return set[string(mac)], nil
}
