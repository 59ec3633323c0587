package lab

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// StartVipd runs `vipd run` in the host's namespace with lab defaults
// (node name, eth0, a state directory of its own, debug logs) overridden
// by env ("KEY=value").
func (h *Host) StartVipd(bin string, env ...string) (*Proc, error) {
	all, err := h.VipdEnv(env...)
	if err != nil {
		return nil, err
	}
	return h.Start("vipd "+h.Name, all, bin, "run")
}

// RunVipd runs a vipd command (args, such as "cleanup") in the host's
// namespace with the environment StartVipd gives `vipd run` and env, and
// returns its output (stdout and stderr) and exit code.
func (h *Host) RunVipd(ctx context.Context, bin string, env []string, args ...string) (string, int, error) {
	all, err := h.VipdEnv(env...)
	if err != nil {
		return "", 0, err
	}
	cmd := h.Command(ctx, bin, args...)
	cmd.Env = append(os.Environ(), all...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode(), nil
	}
	return string(out), 0, err
}

// VipdEnv returns the environment StartVipd gives vipd on this host: the
// lab defaults (node name, eth0, a state directory of its own, debug logs,
// the lab's gossip key for nodes with peers) followed by env.
func (h *Host) VipdEnv(env ...string) ([]string, error) {
	state := h.StateDir()
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, err
	}
	h.lab.OnClose(func() { _ = os.RemoveAll(state) })
	base := []string{
		"VIPD_NODE_NAME=" + h.Name,
		"VIPD_INTERFACE=" + h.Link,
		"VIPD_STATE_DIR=" + state,
		"VIPD_METRICS_ADDRESS=127.0.0.1:9469",
		"VIPD_LOG_LEVEL=debug",
		"VIPD_SA_TOKEN_PATH=" + filepath.Join(state, "no-token"),
		// Never the host's kubelet certificate or cluster CA.
		"VIPD_HEALTH_CLIENT_CERT=", "VIPD_HEALTH_CLIENT_KEY=", "VIPD_HEALTH_CA_FILE=",
		// A lab runs many vipds on one machine (a package's parallel
		// subtests: 18 at once) beside the test process, which serves
		// every node's apiserver stand-in and runs the clients; at the
		// product's -10 their start-up would starve those, and a test
		// would measure its own starvation as an outage. Tests of the
		// priority itself (test/fast, the bench) set VIPD_NICE=-10.
		"VIPD_NICE=0",
	}
	// Gossip is authenticated by default: nodes started with peers share
	// the lab's key unless the test names its own key file.
	if hasEnv(env, "VIPD_PEERS") && !hasEnv(env, "VIPD_GOSSIP_KEY_FILE") && !hasEnv(env, "VIPD_GOSSIP_INSECURE") {
		key, err := h.lab.GossipKey()
		if err != nil {
			return nil, err
		}
		base = append(base, "VIPD_GOSSIP_KEY_FILE="+key)
	}
	return append(base, env...), nil
}

// StateDir is the VIPD_STATE_DIR StartVipd gives vipd on this host: the
// same on every start, so a restarted vipd finds its state.
func (h *Host) StateDir() string { return filepath.Join(os.TempDir(), "vipd-lab-"+h.NS) }

// Addrs returns the addresses on the host's eth0 (without the lab's own
// base addresses and link-local ones), with their flags as ip prints them.
func (h *Host) Addrs(ctx context.Context) (map[netip.Addr][]string, error) {
	out, err := h.Output(ctx, "ip", "-j", "addr", "show", "dev", h.Link)
	if err != nil {
		return nil, err
	}
	var links []struct {
		AddrInfo []struct {
			Local     string `json:"local"`
			Label     string `json:"label"`
			Tentative bool   `json:"tentative"`
			DadFailed bool   `json:"dadfailed"`
			Deprec    bool   `json:"deprecated"`
			Prefixlen int    `json:"prefixlen"`
			PLft      any    `json:"preferred_life_time"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return nil, fmt.Errorf("parse ip -j addr: %w", err)
	}
	res := map[netip.Addr][]string{}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			ip, err := netip.ParseAddr(a.Local)
			if err != nil || ip == h.IPv4 || ip == h.IPv6 || ip.IsLinkLocalUnicast() {
				continue
			}
			var flags []string
			flags = append(flags, fmt.Sprintf("/%d", a.Prefixlen))
			if a.Label != "" {
				flags = append(flags, "label="+a.Label)
			}
			if a.Tentative {
				flags = append(flags, "tentative")
			}
			if a.DadFailed {
				flags = append(flags, "dadfailed")
			}
			if a.Deprec {
				flags = append(flags, "deprecated")
			}
			res[ip] = flags
		}
	}
	return res, nil
}

// HasAddr reports whether addr is bound on the host's eth0.
func (h *Host) HasAddr(ctx context.Context, addr netip.Addr) (bool, error) {
	m, err := h.Addrs(ctx)
	if err != nil {
		return false, err
	}
	_, ok := m[addr]
	return ok, nil
}

// WaitAddr waits until addr is (present=true) or is not bound on eth0.
func (h *Host) WaitAddr(ctx context.Context, addr netip.Addr, present bool) error {
	for {
		ok, err := h.HasAddr(ctx, addr)
		if err != nil {
			return err
		}
		if ok == present {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: waiting for %s present=%v: %w", h.Name, addr, present, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Holders returns the nodes that have addr bound.
func (l *Lab) Holders(ctx context.Context, addr netip.Addr) ([]string, error) {
	var out []string
	for _, n := range l.Nodes {
		ok, err := n.HasAddr(ctx, addr)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, n.Name)
		}
	}
	return out, nil
}

// Neigh returns the MAC the host's neighbour table has for addr ("" if none).
func (h *Host) Neigh(ctx context.Context, addr netip.Addr) (string, error) {
	out, err := h.Output(ctx, "ip", "neigh", "show", addr.String(), "dev", h.Link)
	if err != nil {
		return "", err
	}
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "lladdr" {
			return f[i+1], nil
		}
	}
	return "", nil
}

func hasEnv(env []string, name string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, name+"=") {
			return true
		}
	}
	return false
}

// GossipKey returns the path of the lab's gossip key file (made once, with
// the same bytes for every node of the lab).
func (l *Lab) GossipKey() (string, error) {
	p := filepath.Join(os.TempDir(), "vipd-lab-"+l.ID+"-gossip.key")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return "", err
	}
	// Written aside and linked into place: nodes started at once agree
	// on the first key linked.
	tmp := fmt.Sprintf("%s.%d", p, time.Now().UnixNano())
	if err := os.WriteFile(tmp, []byte(base64.StdEncoding.EncodeToString(k)+"\n"), 0o600); err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, p); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	l.OnClose(func() { _ = os.Remove(p) })
	return p, nil
}
