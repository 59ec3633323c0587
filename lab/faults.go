package lab

import (
	"context"
	"fmt"
	"strings"
	"syscall"
)

// cutTable is the nftables table (family inet) that Cut and DropOneWay
// fill inside a host's namespace; Heal deletes it. It lives only in lab
// namespaces and goes with them.
const cutTable = "vipdlabcut"

// PowerOff makes the host vanish as a virtual machine switched off hard
// does: every given process gets SIGKILL (its whole process group), then
// the host's veth pair is deleted at the bridge, so its eth0 and every
// address bound on it are gone and nothing it had queued leaves it. There
// is no way back: a replacement machine is another host.
func (h *Host) PowerOff(ctx context.Context, procs ...*Proc) error {
	for _, p := range procs {
		if p == nil {
			continue
		}
		if !p.Exited() {
			_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
		}
	}
	for _, p := range procs {
		if p != nil {
			p.Kill() // waits for the exit
		}
	}
	if err := ip(ctx, "-n", h.lab.BridgeNS, "link", "del", h.Peer); err != nil {
		return fmt.Errorf("power off %s: %w", h.Name, err)
	}
	return nil
}

// Cut drops every IP packet between a and b, both ways, as a broken link
// between two machines that both still reach everybody else (a
// non-transitive network). Only IP is dropped: ARP between them still
// flows, as on a segment where a firewall, not the switch, is at fault.
func Cut(ctx context.Context, a, b *Host) error {
	return a.nftCut(ctx,
		fmt.Sprintf("add rule inet %s in ip saddr %s drop", cutTable, b.IPv4),
		fmt.Sprintf("add rule inet %s in ip6 saddr %s drop", cutTable, b.IPv6),
		fmt.Sprintf("add rule inet %s out ip daddr %s drop", cutTable, b.IPv4),
		fmt.Sprintf("add rule inet %s out ip6 daddr %s drop", cutTable, b.IPv6),
	)
}

// DropOneWay drops every IP packet from "from" that arrives at "to"; what
// "to" sends still reaches "from" (one-way loss). Connection-oriented
// traffic between them fails both ways; datagrams from "to" still arrive.
func DropOneWay(ctx context.Context, from, to *Host) error {
	return to.nftCut(ctx,
		fmt.Sprintf("add rule inet %s in ip saddr %s drop", cutTable, from.IPv4),
		fmt.Sprintf("add rule inet %s in ip6 saddr %s drop", cutTable, from.IPv6),
	)
}

// Heal removes every Cut and DropOneWay rule in the host's namespace.
func (h *Host) Heal(ctx context.Context) error {
	out, err := h.nft(ctx, fmt.Sprintf("delete table inet %s\n", cutTable))
	if err != nil && !strings.Contains(out, "No such file") {
		return err
	}
	return nil
}

func (h *Host) nftCut(ctx context.Context, rules ...string) error {
	script := fmt.Sprintf("add table inet %[1]s\n"+
		"add chain inet %[1]s in { type filter hook input priority -10; }\n"+
		"add chain inet %[1]s out { type filter hook output priority -10; }\n", cutTable) +
		strings.Join(rules, "\n") + "\n"
	_, err := h.nft(ctx, script)
	return err
}

func (h *Host) nft(ctx context.Context, script string) (string, error) {
	cmd := h.Command(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("nft in %s: %w: %s", h.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
