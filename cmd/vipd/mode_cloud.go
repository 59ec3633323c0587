package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/cloud"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/vip"
)

// cloudPrimeTimeout bounds the start-up check of the cloud IPs. A rejected
// token or an unknown IP stops start-up; an API that does not answer within
// this time only delays the check until the IP is needed.
const cloudPrimeTimeout = 10 * time.Second

// The cloud announcer bounds the driver's actions itself: an assign
// includes polling the provider's action.
var (
	_ vip.SlowActions      = (*cloud.Announcer)(nil)
	_ vip.HandoverAcquirer = (*cloud.Announcer)(nil) // a planned handover skips the cool-off
)

// newCloudAnnouncer builds the cloud-mode announcer: the configured
// provider's backend behind cloud.Announcer. A missing or unreadable token
// is a configuration error (exit 2); a token the API rejects, or a VIP that
// is not an IP of the account, stops start-up with exit 1.
func newCloudAnnouncer(ctx context.Context, c *config.Config, log *slog.Logger, reg prometheus.Registerer, addStatus func(string, func() any)) (vip.Announcer, error) {
	metrics, err := cloud.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	clog := log.With("component", "cloud")
	p, api, err := newCloudProvider(ctx, c, clog, metrics)
	var se *cloud.SettingError
	if errors.As(err, &se) {
		accepted := se.Accepted
		if se.Err != nil {
			accepted += " (" + se.Err.Error() + ")"
		}
		return nil, &config.Error{Name: se.Name, Value: se.Value, Accepted: accepted}
	}
	if err != nil {
		return nil, fmt.Errorf("cloud mode: %w", err)
	}
	opts := cloud.AnnouncerOptions{Logger: clog}
	bind := c.CloudBindInterface
	if bind == "" && cloud.DeliversToAddress(p) {
		if bind, err = vip.DefaultInterface(); err != nil {
			return nil, &config.Error{Name: "VIPD_CLOUD_BIND_INTERFACE", Value: "", Accepted: "an interface to configure the " + p.Name() +
				" IP on (no default route to take it from: " + err.Error() + "), or none if it is configured by other means"}
		}
	}
	if bind != "" && bind != "none" {
		if _, err := net.InterfaceByName(bind); err != nil {
			return nil, &config.Error{Name: "VIPD_CLOUD_BIND_INTERFACE", Value: bind, Accepted: "an existing interface, or none (" + err.Error() + ")"}
		}
		b, err := cloud.NewLinkBinder(bind)
		if err != nil {
			return nil, fmt.Errorf("VIPD_CLOUD_BIND_INTERFACE: %w", err)
		}
		opts.Binder = b
	}
	ann := cloud.NewAnnouncer(p, opts)
	pctx, cancel := context.WithTimeout(ctx, cloudPrimeTimeout)
	defer cancel()
	if err := ann.Prime(pctx, c.Addresses); err != nil {
		_ = ann.Close()
		return nil, fmt.Errorf("cloud mode start-up check: %w", err)
	}
	clog.Info("cloud mode ready", "provider", p.Name(), "instance", p.Instance(), "api", api, "bind_interface", bind)
	addStatus("cloud", ann.Status)
	return ann, nil
}

// newCloudProvider builds the backend named by VIPD_CLOUD_PROVIDER and
// returns it with its API URL. A provider that delivers the IP to the
// address itself (Hetzner) gets the address configured by default.
func newCloudProvider(ctx context.Context, c *config.Config, log *slog.Logger, m *cloud.Metrics) (cloud.Provider, string, error) {
	switch c.CloudProvider {
	case cloud.ProviderHetzner:
		h, err := cloud.NewHetzner(ctx, cloud.HetznerConfig{
			Token:         c.HcloudToken,
			TokenFile:     c.HcloudTokenFile,
			APIURL:        c.HcloudAPIURL,
			MetadataURL:   c.HcloudMetadataURL,
			ServerID:      c.HcloudServerID,
			FloatingIPIDs: c.HcloudFloatingIPIDs,
			Client:        cloud.Client{UserAgent: "vipd/" + version, Logger: log, Metrics: m},
		})
		return h, c.HcloudAPIURL, err
	case cloud.ProviderDigitalOcean, "":
		do, err := cloud.NewDigitalOcean(ctx, cloud.DOConfig{
			Token:       c.DOToken,
			TokenFile:   c.DOTokenFile,
			APIURL:      c.DOAPIURL,
			MetadataURL: c.DOMetadataURL,
			DropletID:   c.DODropletID,
			Client:      cloud.Client{UserAgent: "vipd/" + version, Logger: log, Metrics: m},
		})
		return do, c.DOAPIURL, err
	}
	return nil, "", &config.Error{Name: "VIPD_CLOUD_PROVIDER", Value: c.CloudProvider, Accepted: "one of digitalocean, hetzner"}
}
