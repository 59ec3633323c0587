package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/poolfeed"
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
