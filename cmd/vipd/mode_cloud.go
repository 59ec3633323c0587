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

// cloudPrimeTimeout bounds the start-up check of the reserved IPs. A
// rejected token or an unknown IP stops start-up; an API that does not
// answer within this time only delays the check until the IP is needed.
const cloudPrimeTimeout = 10 * time.Second

// newCloudAnnouncer builds the cloud-mode announcer: the DigitalOcean
// reserved-IP backend behind cloud.Announcer. A missing or unreadable token
// is a configuration error (exit 2); a token the API rejects, or a VIP that
// is not a reserved IP of the account, stops start-up with exit 1.
func newCloudAnnouncer(ctx context.Context, c *config.Config, log *slog.Logger, reg prometheus.Registerer, addStatus func(string, func() any)) (vip.Announcer, error) {
	if c.CloudProvider != "" && c.CloudProvider != cloud.ProviderDigitalOcean {
		return nil, &config.Error{Name: "VIPD_CLOUD_PROVIDER", Value: c.CloudProvider, Accepted: "digitalocean"}
	}
	metrics, err := cloud.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	clog := log.With("component", "cloud")
	do, err := cloud.NewDigitalOcean(ctx, cloud.DOConfig{
		Token:       c.DOToken,
		TokenFile:   c.DOTokenFile,
		APIURL:      c.DOAPIURL,
		MetadataURL: c.DOMetadataURL,
		DropletID:   c.DODropletID,
		UserAgent:   "vipd/" + version,
		Logger:      clog,
		Metrics:     metrics,
	})
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
	if c.CloudBindInterface != "" {
		if _, err := net.InterfaceByName(c.CloudBindInterface); err != nil {
			return nil, &config.Error{Name: "VIPD_CLOUD_BIND_INTERFACE", Value: c.CloudBindInterface, Accepted: "an existing interface (" + err.Error() + ")"}
		}
		b, err := cloud.NewLinkBinder(c.CloudBindInterface)
		if err != nil {
			return nil, fmt.Errorf("VIPD_CLOUD_BIND_INTERFACE: %w", err)
		}
		opts.Binder = b
	}
	ann := cloud.NewAnnouncer(do, opts)
	pctx, cancel := context.WithTimeout(ctx, cloudPrimeTimeout)
	defer cancel()
	if err := ann.Prime(pctx, c.Addresses); err != nil {
		_ = ann.Close()
		return nil, fmt.Errorf("cloud mode start-up check: %w", err)
	}
	clog.Info("cloud mode ready", "provider", do.Name(), "droplet", do.DropletID(), "api", c.DOAPIURL)
	addStatus("cloud", ann.Status)
	return ann, nil
}
