package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// AddLink gives the host a second interface on the lab's segment (a veth
// pair into the bridge, like a second NIC in the same VLAN), up, with the
// given address (any prefix length; invalid: none) and a MAC of its own,
// which it returns. The interface goes with the host's namespace.
func (h *Host) AddLink(ctx context.Context, name string, addr netip.Prefix) (net.HardwareAddr, error) {
	peer := "v" + h.Name + name
	if len(peer) > 15 {
		return nil, fmt.Errorf("lab: interface name %s too long", peer)
	}
	mac := net.HardwareAddr{h.MAC[0], h.MAC[1], h.MAC[2], h.MAC[3], h.MAC[4] ^ 0x80, h.MAC[5]}
	cmds := [][]string{
		{"-n", h.lab.BridgeNS, "link", "add", peer, "type", "veth", "peer", "name", name, "netns", h.NS},
		{"-n", h.lab.BridgeNS, "link", "set", peer, "master", "br0"},
		{"-n", h.lab.BridgeNS, "link", "set", peer, "up"},
		{"-n", h.NS, "link", "set", name, "address", mac.String()},
	}
	if addr.IsValid() {
		cmds = append(cmds, []string{"-n", h.NS, "addr", "add", addr.String(), "dev", name, "nodad"})
	}
	cmds = append(cmds, []string{"-n", h.NS, "link", "set", name, "up"})
	for _, c := range cmds {
		if err := ip(ctx, c...); err != nil {
			return nil, err
		}
	}
	return mac, nil
}

// BridgeNft loads an nftables ruleset (nft -f syntax) into the lab's
// bridge namespace: the switch's own filters (e.g. a bridge-family table
// dropping one port's ARP replies). The namespace, and the rules with it,
// go when the lab closes.
func (l *Lab) BridgeNft(ctx context.Context, ruleset string) error {
	f, err := os.CreateTemp("", "vipd-lab-nft-*.nft")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(ruleset); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", l.BridgeNS, "nft", "-f", f.Name()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft -f %s in %s: %w: %s", filepath.Base(f.Name()), l.BridgeNS, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Announce makes the host claim addr on eth0 the way a foreign host that
// took the address does: gratuitous ARP (IPv4) or an unsolicited
// neighbour advertisement with the Override flag (IPv6), from its own MAC.
// IPv4 sends a gratuitous Request and Reply, as arping -U and vipd do.
// Bind the address first (ip addr add) for the host to answer requests too.
func (h *Host) Announce(addr netip.Addr) error {
	return h.Run(func() error {
		ifi, err := net.InterfaceByName(h.Link)
		if err != nil {
			return err
		}
		if addr.Is4() {
			c, err := arp.Dial(ifi)
			if err != nil {
				return fmt.Errorf("lab: ARP socket in %s: %w", h.NS, err)
			}
			defer c.Close()
			for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
				p, err := arp.NewPacket(op, ifi.HardwareAddr, addr, ethernet.Broadcast, addr)
				if err != nil {
					return err
				}
				if err := c.WriteTo(p, ethernet.Broadcast); err != nil {
					return err
				}
			}
			return nil
		}
		c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
		if err != nil {
			return fmt.Errorf("lab: NDP socket in %s: %w", h.NS, err)
		}
		defer c.Close()
		na := &ndp.NeighborAdvertisement{
			Override:      true,
			TargetAddress: addr,
			Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ifi.HardwareAddr}},
		}
		return c.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes())
	})
}

// ReplaceLink deletes the host's eth0 and creates it again under the same
// name, MAC and addresses, attached to the bridge again (a bond or VLAN
// re-created by the network configuration): a new interface index.
func (h *Host) ReplaceLink(ctx context.Context) error {
	cmds := [][]string{
		{"-n", h.lab.BridgeNS, "link", "del", h.Peer},
		{"-n", h.lab.BridgeNS, "link", "add", h.Peer, "type", "veth", "peer", "name", h.Link, "netns", h.NS},
		{"-n", h.lab.BridgeNS, "link", "set", h.Peer, "master", "br0"},
		{"-n", h.lab.BridgeNS, "link", "set", h.Peer, "up"},
		{"-n", h.NS, "link", "set", h.Link, "address", h.MAC.String()},
		{"-n", h.NS, "addr", "add", netip.PrefixFrom(h.IPv4, 24).String(), "dev", h.Link},
		{"-n", h.NS, "-6", "addr", "add", netip.PrefixFrom(h.IPv6, 64).String(), "dev", h.Link, "nodad"},
		{"-n", h.NS, "link", "set", h.Link, "up"},
	}
	for _, c := range cmds {
		if err := ip(ctx, c...); err != nil {
			return err
		}
	}
	return sysctl(ctx, h.NS, "net.ipv6.neigh."+h.Link+".retrans_time_ms", "100")
}
