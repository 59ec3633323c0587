// Package pools announces the allocated addresses of vipd's IP pools
// (IPPool, IPAllocation) from every vipd node with VIPD_POOLS=on.
//
// The package has three parts:
//
//   - the feed (feed.go): a child process (`vipd-controllers pools-feed`)
//     watches the Kubernetes API and writes the desired view, one JSON
//     snapshot a line, on its standard output; Feed runs and restarts it and
//     keeps the last snapshot (also on disk) while it is down;
//   - Machine (machine.go): a pure state machine fed (event, now) that
//     decides which addresses this node holds and returns the actions to
//     take and its next deadline;
//   - Driver (driver.go): runs the machine, performs its actions in
//     batches (one probe socket, one netlink listing, one timer) and serves
//     the status.
//
// In l2 mode each address has one holder among its eligible nodes, chosen
// by rendezvous (highest random weight) hashing of (address, node name)
// over the cluster members that are alive, eligible in the election and run
// pools. Every node computes the same answer from its own view, so nothing
// per address is gossiped: the number of addresses is not limited by the
// gossip metadata. In bgp mode every eligible node advertises every address.
package pools

import (
	"net/netip"

	"github.com/vipd/vipd/internal/wire"
)

// Modes of a pool, as in IPPool.spec.mode.
const (
	ModeL2  = "l2"
	ModeBGP = "bgp"
)

// Address is one allocated address as the feed describes it, and
// Snapshot one line of the feed: declared in internal/wire, which
// vipd-controllers pools-feed writes without linking this package.
type (
	Address  = wire.PoolAddress
	Snapshot = wire.PoolSnapshot
)

// weight is the rendezvous weight of node for addr: a 64-bit hash of both,
// well mixed so that each node wins an even share.
func weight(addr netip.Addr, node string) uint64 {
	// FNV-1a over the 16-byte address, a zero byte and the name.
	const offset, prime = 14695981039346656037, 1099511628211
	x := uint64(offset)
	b := addr.As16()
	for _, c := range b {
		x = (x ^ uint64(c)) * prime
	}
	x *= prime // the zero separator
	for i := 0; i < len(node); i++ {
		x = (x ^ uint64(node[i])) * prime
	}
	// splitmix64 finalizer: FNV's low bits are weak for similar inputs.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Winner returns the node among cands with the highest weight for addr
// (ties: the lower name), "" when cands is empty.
func Winner(addr netip.Addr, cands []string) string {
	best, bw := "", uint64(0)
	for _, n := range cands {
		w := weight(addr, n)
		if best == "" || w > bw || w == bw && n < best {
			best, bw = n, w
		}
	}
	return best
}
