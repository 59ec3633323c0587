package cordon

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/wire"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Watched reports whether this node's vipd has VIPs whose holder is
// elected (config.Elects): then a cordoned Node hands them over. A lone
// node has nobody to hand over to; in bgp mode every node announces.
func Watched(c *config.Config) bool {
	return len(c.Addresses) > 0 && c.Elects()
}

// Run runs Watch for VIPD_NODE_NAME with the client configuration rc,
// asking the daemon over its control socket in VIPD_STATE_DIR.
func Run(ctx context.Context, c *config.Config, rc *rest.Config, log *slog.Logger) error {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("cordon watch: %w", err)
	}
	sock := filepath.Join(c.StateDir, wire.ControlSocket)
	return Watch(ctx, cs, c.NodeName, 0, func(ctx context.Context) (string, error) {
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
