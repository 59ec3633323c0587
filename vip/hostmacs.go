package vip

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// hostMACsMaxAge is how old the set of this host's MACs may be when a MAC
// not in it is looked up while no netlink watch follows the links: older,
// the links are listed again first. It bounds the netlink dumps that the
// holder's answers to the verification rounds (a foreign MAC every
// second) and a host flooding claims can cause.
const hostMACsMaxAge = 10 * time.Second

// hostMACsWatchedMaxAge replaces hostMACsMaxAge while the netlink watch
// runs: the watch marks the set stale on every link change and on every
// notification it could not read, so the age only guards against a
// change the kernel never reported. A dump of every link costs 1 to 3 ms
// of CPU on a small VM (parsing every attribute of every link), which
// every 10 s was several percent of an idle follower's CPU.
const hostMACsWatchedMaxAge = 5 * time.Minute

// hostMACs is the set of this host's own link-layer addresses: every
// interface of the network namespace (bonds, their slaves' permanent
// addresses, VLANs, bridges, veths), so that an answer from one of them is
// never taken for another holder. Linux answers ARP for any local address
// on every interface (arp_ignore 0), so a second interface on the VIP's
// segment answers the holder's own probe.
//
// The set is listed lazily: when a MAC not in it is looked up and the set
// is stale (a link changed, see invalidate) or older than hostMACsMaxAge
// (hostMACsWatchedMaxAge while the netlink watch runs, see watching).
type hostMACs struct {
	list func() ([]netlink.Link, error) // netlink.LinkList; tests replace it

	mu      sync.Mutex
	set     map[string]bool
	read    time.Time
	stale   bool
	watched bool
}

func newHostMACs() *hostMACs { return &hostMACs{list: netlink.LinkList, stale: true} }

// invalidate marks the set stale: a link was added, changed or removed.
func (h *hostMACs) invalidate() {
	h.mu.Lock()
	h.stale = true
	h.mu.Unlock()
}

// watching tells whether the netlink watch follows the links from now on
// (it subscribed) or no longer (it stopped). Either way the set is read
// again at the next miss: changes before a subscription were not seen.
func (h *hostMACs) watching(on bool) {
	h.mu.Lock()
	h.watched, h.stale = on, true
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
	maxAge := hostMACsMaxAge
	if h.watched {
		maxAge = hostMACsWatchedMaxAge
	}
	if !h.stale && now.Sub(h.read) < maxAge && h.set != nil {
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
