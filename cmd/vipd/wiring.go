package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/vipd/vipd/config"
)

// extraCommands are subcommands added by other parts (manifest, migrate,
// forget), each in its own file.
func extraCommands() []*cobra.Command { return nil }

// runControllers runs the optional Kubernetes controllers.
func runControllers(ctx context.Context, c *config.Config, log *slog.Logger, reg prometheus.Registerer) error {
	return fmt.Errorf("VIPD_CONTROLLERS: %w", errNotImplemented)
}

// checkModeSettings validates settings that other packages parse (BGP
// peers, controllers) so that check-config and run fail the same way.
func checkModeSettings(c *config.Config) error {
	return nil
}

// newElector starts the gossip election (cluster package).
func newElector(c *config.Config, log *slog.Logger, reg prometheus.Registerer) (elector, error) {
	return nil, fmt.Errorf("VIPD_PEERS: gossip election %w", errNotImplemented)
}
