package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kube"
	"k8s.io/client-go/kubernetes"
)

// controlSocket is the daemon's control socket in VIPD_STATE_DIR, the
// channel `vipd handover` uses (cmd/vipd/control.go).
const controlSocket = "vipd.sock"

// cordonWatched reports whether this node's vipd elects holders (l2 or
// cloud mode with peers and VIPs): then a cordoned Node hands its VIPs
// over. A lone node has nobody to hand over to; in bgp mode every node
// announces.
func cordonWatched(c *config.Config) bool {
	return (c.Mode == config.ModeL2 || c.Mode == config.ModeCloud) && len(c.Addresses) > 0 && len(c.Peers) > 0
}

// runCordonWatch runs kube.WatchCordon for VIPD_NODE_NAME, asking the
// daemon over its control socket.
func runCordonWatch(ctx context.Context, c *config.Config, log *slog.Logger) error {
	rc, err := restConfig(c)
	if err != nil {
		return fmt.Errorf("cordon watch: kubeconfig: %w", err)
	}
	rc.UserAgent = "vipd-controllers/" + version + " (cordon)"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("cordon watch: %w", err)
	}
	sock := filepath.Join(c.StateDir, controlSocket)
	return kube.WatchCordon(ctx, cs, c.NodeName, 0, func(ctx context.Context) (string, error) {
		return askHandover(ctx, sock)
	}, log.With("component", "cordon"))
}

// handoverResult is the part of the daemon's answer (cluster.HandoverResult)
// the summary needs.
type handoverResult struct {
	VIP    string `json:"vip"`
	To     string `json:"to"`
	OK     bool   `json:"ok"`
	Reason string `json:"reason"`
}

// askHandover posts an empty handover request (every VIP held, to the
// best successor) on the control socket and summarizes the answer.
func askHandover(ctx context.Context, sock string) (string, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://vipd/handover", strings.NewReader("{}"))
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("vipd control socket %s: %w", sock, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("handover: %s", strings.TrimSpace(string(b)))
	}
	var rs []handoverResult
	if err := json.Unmarshal(b, &rs); err != nil {
		return "", fmt.Errorf("handover: unreadable answer: %w", err)
	}
	var parts []string
	for _, r := range rs {
		switch {
		case r.OK:
			parts = append(parts, r.VIP+" handed over to "+r.To)
		case r.VIP == "":
			parts = append(parts, r.Reason)
		default:
			parts = append(parts, r.VIP+": "+r.Reason)
		}
	}
	return strings.Join(parts, "; "), nil
}
