package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/controllers/egressfeed"
	"github.com/vipd/vipd/controllers/poolfeed"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// runFeed is main for the per-node feeds that vipd runs as children (not
// leader-elected): the settings vipd passes, a log tagged with the feed's
// name, and run until SIGTERM, writing NDJSON lines to standard output.
func runFeed(name string, run func(ctx context.Context, c *config.Config, out io.Writer, log *slog.Logger) error) error {
	c, err := config.Load(config.EnvSource)
	if err != nil {
		return err
	}
	log := c.NewLogger(os.Stderr).With("component", name)
	klog.SetSlogLogger(log.With("component", "client-go"))
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	err = run(ctx, c, os.Stdout, log)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// runPoolsFeed is `vipd-controllers pools-feed` (VIPD_POOLS=on): the
// desired pool addresses, one snapshot a line (package poolfeed).
func runPoolsFeed(ctx context.Context, c *config.Config, out io.Writer, log *slog.Logger) error {
	return poolfeed.Run(ctx, poolfeed.Config{Kubeconfig: c.Kubeconfig, UserAgent: "vipd-pools-feed/" + version}, out, log)
}

// runEgressFeed is `vipd-controllers egressfeed` (VIPD_EGRESS_POLICIES=on):
// the resolved egress rules, one rule set a line (package egressfeed).
func runEgressFeed(ctx context.Context, c *config.Config, out io.Writer, log *slog.Logger) error {
	rc, err := restConfig(c)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "vipd-egressfeed/" + version
	return egressfeed.Run(ctx, c, rc, out, log)
}

// restConfig is the client configuration of the egress feed and the
// cordon watch: VIPD_KUBECONFIG, or the pod's service account.
func restConfig(c *config.Config) (*rest.Config, error) {
	if c.Kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	}
	return rest.InClusterConfig()
}
