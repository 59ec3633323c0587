package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/vipd/vipd/bgp"
	"github.com/vipd/vipd/cloud"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/egress"
	"github.com/vipd/vipd/vip"
	"github.com/vishvananda/netlink"
)

func newCleanupCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "remove the VIPs and egress rules a vipd that is not running left on this node",
		Long: `cleanup removes what a vipd that stopped without releasing it (killed,
crashed, out of memory) left in this node's kernel: the configured VIPs (l2
and cloud: on their interface; bgp: on VIPD_BGP_INTERFACE), in l2 mode also
every IPv4 address bound with vipd's label (pool and EgressPolicy addresses)
and the egress rules (nftables table, policy routing). It reads the settings
as "vipd run" does and prints one line per address or rule set removed.

A vipd that starts removes the same leftovers itself. vipd.service runs
cleanup (through vipd-cleanup.service, OnFailure=) when the unit fails for
good: its restart limit reached, or killed after its stop timeout. Without
it the dead holder's VIP stays bound and answers ARP next to the holder the
other nodes elect. Cloud providers are not called: the reserved or floating
IP stays assigned until the new holder moves it.

cleanup refuses while vipd runs on this node (it holds a lock on
VIPD_STATE_DIR/vipd.lock, its control socket there answers, or a "vipd run"
process shares this network namespace), exit code 1.`,
		Args: cobra.NoArgs,
	}
	v := settingsFlags(cmd.Flags())
	envFile := envFileFlag(cmd)
	settingsUsage(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := envFile(cmd.ErrOrStderr()); err != nil {
			return err
		}
		// The gossip key is not read: a damaged key file must not keep
		// the dead vipd's VIPs bound.
		c, err := loadSettings(v)
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		if ctx == nil {
			ctx = context.Background()
		}
		return cleanup(ctx, c, cmd.OutOrStdout())
	}
	return cmd
}

// errRunning: cleanup found a vipd running on this node.
var errRunning = errors.New("vipd is running on this node")

// cleanup removes what a dead vipd with configuration c left in the kernel
// and writes one line per removal to out.
func cleanup(ctx context.Context, c *config.Config, out io.Writer) error {
	if runLockHeld(c.StateDir) {
		return fmt.Errorf("%w (it holds %s): stop it first, it releases what it holds itself", errRunning, filepath.Join(c.StateDir, RunLock))
	}
	if sock := filepath.Join(c.StateDir, ControlSocket); daemonAnswers(ctx, sock) {
		return fmt.Errorf("%w (%s answers): stop it first, it releases what it holds itself", errRunning, sock)
	}
	if pids, err := runningVipd(); err != nil {
		return fmt.Errorf("cannot tell whether vipd runs on this node: %w", err)
	} else if len(pids) > 0 {
		return fmt.Errorf("%w (pid %s: vipd run in this network namespace): stop it first, it releases what it holds itself", errRunning, strings.Trim(fmt.Sprint(pids), "[]"))
	}
	removed := 0
	note := func(format string, args ...any) {
		removed++
		fmt.Fprintf(out, format+"\n", args...)
	}
	var err error
	switch c.Mode {
	case config.ModeL2:
		err = cleanupL2(ctx, c, note)
	case config.ModeBGP:
		err = cleanupBGP(c, note)
	case config.ModeCloud:
		err = cleanupCloud(ctx, c, note)
	}
	if err != nil {
		return err
	}
	if removed == 0 {
		fmt.Fprintln(out, "nothing to clean up")
	}
	return nil
}

// daemonAnswers reports whether something accepts connections on the
// control socket: a running vipd (a socket file a dead vipd left behind
// refuses them).
func daemonAnswers(ctx context.Context, sock string) bool {
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// cleanupL2 removes the configured VIPs, every IPv4 address with vipd's
// label, and the egress rules.
func cleanupL2(ctx context.Context, c *config.Config, note func(string, ...any)) error {
	iface := c.Interface
	if iface == "" {
		var err error
		if iface, err = vip.DefaultInterface(); err != nil {
			return fmt.Errorf("VIPD_INTERFACE is not set and %w", err)
		}
	}
	var errs []error
	// An interface that is gone took its addresses with it; the egress
	// rules below are the host's and are removed all the same.
	if _, err := netlink.LinkByName(iface); errors.As(err, new(netlink.LinkNotFoundError)) {
		note("interface %s is gone, and its addresses with it", iface)
	} else if l2, err := vip.NewL2(vip.L2Options{Interface: iface}, slog.New(slog.DiscardHandler), prometheus.NewRegistry()); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, cleanupAddrs(ctx, c, l2, iface, note)...)
	}
	k, err := egress.NewKernel()
	if err != nil {
		errs = append(errs, fmt.Errorf("egress rules: %w", err))
		return errors.Join(errs...)
	}
	defer k.Close()
	ch, err := k.Remove(egressSettings(c, 0))
	if err != nil {
		errs = append(errs, fmt.Errorf("egress rules: %w", err))
	} else if !ch.Empty() {
		note("removed egress rules: %s", ch.Summary())
	}
	return errors.Join(errs...)
}

// cleanupAddrs removes the configured VIPs and every IPv4 address with
// vipd's label from the l2 interface.
func cleanupAddrs(ctx context.Context, c *config.Config, l2 *vip.L2, iface string, note func(string, ...any)) []error {
	var errs []error
	for _, p := range c.Addresses {
		ok, err := l2.Present(ctx, p)
		if err == nil && ok {
			err = l2.Release(ctx, p)
			if err == nil {
				note("removed VIP %s from %s", p, iface)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("VIP %s on %s: %w", p, iface, err))
		}
	}
	labelled, err := l2.Labelled()
	if err != nil {
		errs = append(errs, err)
	}
	if len(labelled) > 0 {
		left, err := l2.ReleaseMany(ctx, labelled)
		for _, a := range labelled {
			if !slices.Contains(left, a) {
				note("removed %s (vipd's label) from %s", a, iface)
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// cleanupBGP removes the configured VIPs from the interface the speaker
// binds them on. The routes went with the dead vipd's sessions.
func cleanupBGP(c *config.Config, note func(string, ...any)) error {
	bc, err := bgpConfig(c)
	if err != nil {
		return usageError{err}
	}
	iface := bc.Interface
	if iface == "" {
		iface = "lo"
	}
	var errs []error
	for _, p := range c.Addresses {
		ok, err := bgp.UnbindLocal(iface, p)
		if err != nil {
			errs = append(errs, fmt.Errorf("VIP %s on %s: %w", p, iface, err))
		} else if ok {
			note("removed VIP %s from %s", p, iface)
		}
	}
	return errors.Join(errs...)
}

// cleanupCloud removes the configured IPs from VIPD_CLOUD_BIND_INTERFACE,
// when one is set; the provider is not called.
func cleanupCloud(ctx context.Context, c *config.Config, note func(string, ...any)) error {
	bind := c.CloudBindInterface
	if bind == "" || bind == "none" {
		return nil
	}
	b, err := cloud.NewLinkBinder(bind)
	if err != nil {
		return fmt.Errorf("VIPD_CLOUD_BIND_INTERFACE %s: %w", bind, err)
	}
	defer b.Close()
	var errs []error
	for _, p := range c.Addresses {
		ok, err := b.Bound(p)
		if err == nil && ok {
			if err = b.Unbind(ctx, p); err == nil {
				note("removed %s from %s", p, bind)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s on %s: %w", p, bind, err))
		}
	}
	return errors.Join(errs...)
}

// runningVipd returns the pids of the `vipd run` processes in this
// process's network namespace other than this one. It finds a
// vipd that holds no run lock: a release from before the lock (an
// upgrade's old package still running), or one started with another
// VIPD_STATE_DIR. A vipd in another network namespace (a container with
// its own network, the namespace lab) holds nothing here and is not
// counted, nor is one whose namespace this process may not read (the
// kernel asks for its capabilities or CAP_SYS_PTRACE: vipd-cleanup.service
// runs with CAP_NET_ADMIN only, so there the run lock and the control
// socket are the checks).
func runningVipd() ([]int, error) {
	const proc = "/proc"
	self, err := os.Readlink(filepath.Join(proc, "self", "ns", "net"))
	if err != nil {
		return nil, fmt.Errorf("this process's network namespace: %w", err)
	}
	me := os.Getpid()
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == me {
			continue
		}
		b, err := os.ReadFile(filepath.Join(proc, e.Name(), "cmdline"))
		if err != nil || !isVipdRun(b) {
			continue // gone, or not ours to read
		}
		if ns, err := os.Readlink(filepath.Join(proc, e.Name(), "ns", "net")); err == nil && ns == self {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// isVipdRun reports whether a /proc/PID/cmdline (NUL-separated) is
// `vipd ... run ...`.
func isVipdRun(cmdline []byte) bool {
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	return len(args) > 1 && filepath.Base(args[0]) == "vipd" && slices.Contains(args[1:], "run")
}
