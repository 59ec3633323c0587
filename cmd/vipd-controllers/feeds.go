package main

import (
	"context"
	"errors"
	"fmt"
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

// runPoolsFeed is `vipd-controllers pools-feed`: started by every vipd with
// VIPD_POOLS=on (not leader-elected), it writes the desired pool addresses
// to standard output, one JSON snapshot a line (package poolfeed).
func runPoolsFeed() error {
	c, err := config.Load(config.EnvSource)
	if err != nil {
		return err
	}
	log := c.NewLogger(os.Stderr).With("component", "pools-feed")
	klog.SetSlogLogger(log.With("component", "client-go"))
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	err = poolfeed.Run(ctx, poolfeed.Config{Kubeconfig: c.Kubeconfig, UserAgent: "vipd-pools-feed/" + version}, os.Stdout, log)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// runEgressFeed is `vipd-controllers egressfeed`: started by every vipd
// with VIPD_EGRESS_POLICIES=on, it writes the resolved egress rules to
// standard output, one JSON rule set a line (package egressfeed).
func runEgressFeed() error {
	c, err := config.Load(config.EnvSource)
	if err != nil {
		return err
	}
	log := c.NewLogger(os.Stderr).With("component", "egressfeed")
	klog.SetSlogLogger(log.With("component", "client-go"))
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	rc, err := restConfig(c)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "vipd-egressfeed/" + version
	return egressfeed.Run(ctx, c, rc, os.Stdout, log)
}

// restConfig is the client configuration of the per-node feeds and the
// cordon watch: VIPD_KUBECONFIG, or the pod's service account.
func restConfig(c *config.Config) (*rest.Config, error) {
	if c.Kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	}
	return rest.InClusterConfig()
}
