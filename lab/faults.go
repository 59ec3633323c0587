package lab

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
)

// cutTable is the nftables table that Cut fills in the bridge namespace
// (family bridge) and DropOneWay inside a host's namespace (family inet);
// Heal deletes them. They live only in lab namespaces and go with them.
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

// Cut cuts the link between a and b at the bridge: no frame from one
// reaches the other, ARP and broadcasts included, while both still reach
// everybody else (a non-transitive network). Neither node can see the
// other's ARP either, so an ARP probe cannot stand in for the election.
// Heal undoes it.
func (l *Lab) Cut(ctx context.Context, a, b *Host) error {
	script := fmt.Sprintf("add table bridge %[1]s\n"+
		"add chain bridge %[1]s cut { type filter hook forward priority -10; }\n"+
		"add rule bridge %[1]s cut iifname %[2]q oifname %[3]q drop\n"+
		"add rule bridge %[1]s cut iifname %[3]q oifname %[2]q drop\n", cutTable, a.Peer, b.Peer)
	_, err := l.nft(ctx, script)
	return err
}

// Heal removes every Cut of the lab and every DropOneWay of its hosts.
func (l *Lab) Heal(ctx context.Context) error {
	var errs []error
	if out, err := l.nft(ctx, fmt.Sprintf("delete table bridge %s\n", cutTable)); err != nil && !strings.Contains(out, "No such file") {
		errs = append(errs, err)
	}
	for _, h := range l.hosts {
		errs = append(errs, h.Heal(ctx))
	}
	return errors.Join(errs...)
}

func (l *Lab) nft(ctx context.Context, script string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.BridgeNS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("nft in the bridge namespace: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// DropOneWay drops every IP packet from "from" that arrives at "to"; what
// "to" sends still reaches "from" (one-way loss). ARP still works both ways
// (dropping it one way would break both directions). Connection-oriented
// traffic between them fails both ways; datagrams from "to" still arrive.
func DropOneWay(ctx context.Context, from, to *Host) error {
	return to.nftCut(ctx,
		fmt.Sprintf("add rule inet %s in ip saddr %s drop", cutTable, from.IPv4),
		fmt.Sprintf("add rule inet %s in ip6 saddr %s drop", cutTable, from.IPv6),
	)
}

// Heal removes every DropOneWay rule in the host's namespace.
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
