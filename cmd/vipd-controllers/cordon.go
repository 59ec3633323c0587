package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/wire"
	"github.com/vipd/vipd/kube"
	"k8s.io/client-go/kubernetes"
)

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
	sock := filepath.Join(c.StateDir, wire.ControlSocket)
	return kube.WatchCordon(ctx, cs, c.NodeName, 0, func(ctx context.Context) (string, error) {
		return askHandover(ctx, sock)
	}, log.With("component", "cordon"))
}

// askHandover posts an empty handover request (every VIP held, to the
// best successor) on the control socket and summarizes the answer.
func askHandover(ctx context.Context, sock string) (string, error) {
	var rs []wire.HandoverResult
	if err := wire.PostHandover(ctx, sock, wire.HandoverRequest{}, 10*time.Second, &rs); err != nil {
		return "", err
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
