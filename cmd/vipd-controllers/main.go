// Command vipd-controllers runs vipd's optional Kubernetes controllers
// (FLIPOP-compatible FloatingIPPool and NodeDNSRecordSet; services and ipam,
// which hand out IPPool addresses to LoadBalancer Services and Cluster API
// IPAddressClaims). `vipd run`
// starts it as a child process when VIPD_CONTROLLERS is set, so that the
// VIP daemon on every control-plane node does not carry client-go: linking
// it in doubles vipd's resident memory (about 22 MB to 44 MB idle) even
// when no controller runs.
//
// It reads the same settings as vipd from the environment (vipd passes its
// effective configuration) and serves its metrics on the abstract unix
// socket named by VIPD_CONTROLLERS_METRICS_SOCKET, which vipd merges into
// its own /metrics.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/controllers/cordon"
	"github.com/vipd/vipd/controllers/kube"
	"k8s.io/klog/v2"
)

// version is set at link time.
var version = "dev"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vipd-controllers: "+err.Error())
		var ce *config.Error
		if errors.As(err, &ce) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) == 2 && strings.TrimSpace(os.Args[1]) == "egressfeed" {
		return runFeed("egressfeed", runEgressFeed)
	}
	if len(os.Args) == 2 && os.Args[1] == "pools-feed" {
		return runFeed("pools-feed", runPoolsFeed)
	}
	if len(os.Args) > 1 {
		return fmt.Errorf("takes no arguments (or pools-feed, egressfeed): it is started by `vipd run` with VIPD_CONTROLLERS set, VIPD_POOLS=on or VIPD_EGRESS_POLICIES=on")
	}
	c, err := config.Load(config.EnvSource)
	if err != nil {
		return err
	}
	names, err := kube.ParseControllers(c.Controllers)
	if err != nil {
		return err
	}
	// No node= attribute here: the controllers log Kubernetes nodes under
	// that key.
	log := c.NewLogger(os.Stderr)
	// client-go logs through klog (leader election, reflectors): route it
	// into the same structured log instead of raw klog lines on stderr.
	klog.SetSlogLogger(log.With("component", "client-go"))

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()

	reg := prometheus.NewRegistry()
	if sock := os.Getenv("VIPD_CONTROLLERS_METRICS_SOCKET"); sock != "" {
		ln, err := net.Listen("unix", sock)
		if err != nil {
			return fmt.Errorf("metrics socket %s: %w", sock, err)
		}
		srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	token := c.DOToken
	if token == "" && c.DOTokenFile != "" {
		b, err := os.ReadFile(c.DOTokenFile)
		if err != nil {
			return &config.Error{Name: "VIPD_DO_TOKEN_FILE", Value: c.DOTokenFile, Accepted: "a readable file holding the DigitalOcean token (" + err.Error() + ")"}
		}
		token = strings.TrimSpace(string(b))
	}
	flipop := slices.Contains(names, kube.ControllerFloatingIPPool) || slices.Contains(names, kube.ControllerNodeDNSRecordSet)
	if flipop && token == "" && c.CloudflareToken == "" {
		// A configuration error (exit 2): vipd stops instead of restarting
		// a child that can never work.
		return &config.Error{Name: "DIGITALOCEAN_ACCESS_TOKEN", Value: "",
			Accepted: "a provider token for the controllers: DIGITALOCEAN_ACCESS_TOKEN (or VIPD_DO_TOKEN_FILE) and/or CLOUDFLARE_API_TOKEN (or CLOUDFLARE_TOKEN)"}
	}
	if cordon.Watched(c) {
		// Every node, not only the leader: kubectl cordon or drain of
		// this node hands its VIPs over (docs/kubeadm.md).
		done := make(chan struct{})
		go func() {
			defer close(done)
			rc, err := restConfig(c)
			if err != nil {
				err = fmt.Errorf("kubeconfig: %w", err)
			} else {
				rc.UserAgent = "vipd-controllers/" + version + " (cordon)"
				err = cordon.Run(ctx, c, rc, log)
			}
			if err != nil {
				log.Error("the cordon watch stopped", "err", err)
			}
		}()
		defer func() {
			cancel()
			<-done
		}()
	}
	// "cordon" names the cordon watch above, not a controller of kube.Run.
	names = slices.DeleteFunc(names, func(n string) bool { return n == kube.ControllerCordon })
	if len(names) == 0 {
		// VIPD_CONTROLLERS=cordon: the cordon watch alone (or nothing,
		// on a node that does not elect: logged).
		if !cordon.Watched(c) {
			log.Warn("VIPD_CONTROLLERS=cordon, but this node elects no holder (l2 or cloud mode with VIPD_PEERS and VIPD_ADDRESS): nothing to do")
		}
		<-ctx.Done()
		return nil
	}
	err = kube.Run(ctx, kube.Config{
		Kubeconfig: c.Kubeconfig, Controllers: names, ServicesDefaultClass: c.ServicesDefaultClass,
		DOToken: token, DOAPIURL: c.DOAPIURL,
		CloudflareToken: c.CloudflareToken, CloudflareAPIURL: c.CloudflareAPIURL,
		UserAgent: "vipd/" + version,
	}, log, reg)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
