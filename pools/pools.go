// Package pools announces the allocated addresses of vipd's IP pools
// (IPPool, IPAllocation) from every vipd node with VIPD_POOLS=on, and
// (through a second Driver) the runtime egress addresses.
//
// The package has two parts:
//
//   - the feed (feed.go): a child process (`vipd-controllers pools-feed`)
//     watches the Kubernetes API and writes the desired view, one JSON
//     snapshot a line, on its standard output; Feed runs and restarts it and
//     keeps the last snapshot (also on disk) while it is down;
//   - Driver (driver.go): runs the per-address holder machine, vip.Core
//     (the one the control-plane VIPs use), with every address's Props
//     (Props.Pool: the start-up wait, conflicts, leftovers), performs its
//     actions in batches (one probe socket, one netlink listing, one timer)
//     and serves the status.
//
// Who holds an address is decided in one place: in a cluster (l2) the
// lease election's leader places every l2 address on one eligible node and
// grants it a lease (cluster/lease); this node holds what its leases say,
// until each lease's end. Without a cluster (one node, l2 without peers)
// and for bgp addresses, a healthy node holds every address its node
// restriction allows: in bgp mode every eligible node advertises every
// address.
package pools

import "github.com/vipd/vipd/internal/wire"

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
