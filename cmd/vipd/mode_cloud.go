package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/vip"
)

// newCloudAnnouncer builds the cloud-mode announcer (owned by the cloud work).
// addStatus registers a /status section.
func newCloudAnnouncer(ctx context.Context, c *config.Config, log *slog.Logger, reg prometheus.Registerer, addStatus func(string, func() any)) (vip.Announcer, error) {
	return nil, fmt.Errorf("VIPD_MODE=cloud: %w", errNotImplemented)
}
