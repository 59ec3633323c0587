// Package kube holds vipd's optional Kubernetes controllers, compatible with
// DigitalOcean's FLIPOP: FloatingIPPool assigns reserved IPs to the nodes
// that match and NodeDNSRecordSet keeps A records of matching nodes. Only
// the instance holding a Lease acts. See docs/kubernetes.md.
package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
	"github.com/vipd/vipd/controllers/ipam"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// DefaultLeaseName is FLIPOP's Lease name: with the same name and namespace
// a vipd and a FLIPOP never act at the same time during a migration.
const DefaultLeaseName = "floating-ip-pool-controller-leader-election"

// Config configures Run. Zero values take the documented defaults.
type Config struct {
	// Kubeconfig is a kubeconfig path (VIPD_KUBECONFIG). Empty: the
	// in-cluster service account (vipd running in a pod).
	Kubeconfig string
	// RESTConfig, when set, is used instead of Kubeconfig.
	RESTConfig *rest.Config
	// Controllers to run: ControllerFloatingIPPool,
	// ControllerNodeDNSRecordSet, ControllerServices, ControllerIPAM (see
	// ParseControllers). Empty: Run returns at once.
	Controllers []string
	// ServicesDefaultClass makes the services controller also serve
	// LoadBalancer Services without a loadBalancerClass
	// (VIPD_SERVICES_DEFAULT_CLASS, --default-class).
	ServicesDefaultClass bool
	// Namespace limits the watched FloatingIPPools and NodeDNSRecordSets to
	// one namespace. Empty: all namespaces.
	Namespace string

	// DigitalOcean: reserved IPs and DNS. Empty token: provider not offered.
	DOToken  string
	DOAPIURL string // default DefaultDOAPIURL
	// Cloudflare: DNS only. Empty token: provider not offered.
	CloudflareToken  string
	CloudflareAPIURL string // default DefaultCloudflareAPIURL
	// UserAgent sent to the providers. Default "vipd (GOOS GOARCH)".
	UserAgent string
	// ProviderTimeout bounds each provider HTTP request. Default 30s.
	ProviderTimeout time.Duration

	// Leader election. LeaseNamespace defaults to the kubeconfig context's
	// namespace (in a pod: the pod's namespace), like FLIPOP; LeaseName to
	// DefaultLeaseName; Identity to "<hostname>_<random>".
	LeaseNamespace, LeaseName, Identity string
	// LeaseDuration, RenewDeadline, RetryPeriod default to 15s, 10s, 2s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// DNSDebounce (default 2s), DNSMaxDelay (default 30s) and DNSResync
	// (default 10m; negative disables) tune record set writes.
	DNSDebounce, DNSMaxDelay, DNSResync time.Duration
	// Workers per controller. Default 4.
	Workers int
}

// Controller names of vipd's own pools (docs/pools.md).
const (
	// ControllerServices allocates addresses of IPPools to LoadBalancer
	// Services.
	ControllerServices = "services"
	// ControllerIPAM answers Cluster API IPAddressClaims from IPPools.
	ControllerIPAM = "ipam"
	// ControllerCordon names no controller of Run: the cordon watch
	// (cordon.Watch) runs in every vipd-controllers of a node that elects
	// holders; "cordon" alone starts vipd-controllers for it.
	ControllerCordon = "cordon"
)

// acceptedControllers is the accepted form of VIPD_CONTROLLERS.
const acceptedControllers = "a comma list of " + ControllerFloatingIPPool + ", " + ControllerNodeDNSRecordSet + ", " +
	ControllerServices + ", " + ControllerIPAM + " and " + ControllerCordon + " (or empty)"

// ParseControllers parses VIPD_CONTROLLERS: a comma list of
// "floatingippool", "nodednsrecordset", "services" and "ipam"
// (case-insensitive; "" or "none" for none).
func ParseControllers(s string) ([]string, error) {
	var out []string
	s = strings.TrimSpace(s)
	if s == "" || strings.EqualFold(s, "none") {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		name := strings.ToLower(strings.TrimSpace(part))
		switch name {
		case ControllerFloatingIPPool, ControllerNodeDNSRecordSet, ControllerServices, ControllerIPAM, ControllerCordon:
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		default:
			return nil, fmt.Errorf("VIPD_CONTROLLERS=%q: unknown controller %q; accepted: %s",
				s, strings.TrimSpace(part), acceptedControllers)
		}
	}
	return out, nil
}

func (c Config) withDefaults() Config {
	if c.LeaseName == "" {
		c.LeaseName = DefaultLeaseName
	}
	if c.Identity == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.Identity = host + "_" + hex.EncodeToString(b)
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = 15 * time.Second
	}
	if c.RenewDeadline <= 0 {
		c.RenewDeadline = 10 * time.Second
	}
	if c.RetryPeriod <= 0 {
		c.RetryPeriod = 2 * time.Second
	}
	if c.DNSDebounce <= 0 {
		c.DNSDebounce = 2 * time.Second
	}
	if c.DNSMaxDelay <= 0 {
		c.DNSMaxDelay = 30 * time.Second
	}
	if c.DNSResync == 0 {
		c.DNSResync = 10 * time.Minute
	}
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.ProviderTimeout <= 0 {
		c.ProviderTimeout = 30 * time.Second
	}
	if c.UserAgent == "" {
		c.UserAgent = fmt.Sprintf("vipd (%s %s)", runtime.GOOS, runtime.GOARCH)
	}
	return c
}

// restConfig loads the client configuration and the namespace of the
// kubeconfig context (in a pod: the pod's namespace).
func (c Config) restConfig() (*rest.Config, string, error) {
	if c.RESTConfig != nil {
		return rest.CopyConfig(c.RESTConfig), "default", nil
	}
	if c.Kubeconfig != "" {
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			return nil, "", fmt.Errorf("VIPD_KUBECONFIG=%q: %w", c.Kubeconfig, err)
		}
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.Kubeconfig}, &clientcmd.ConfigOverrides{})
		rc, err := cc.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("VIPD_KUBECONFIG=%q: %w", c.Kubeconfig, err)
		}
		ns, _, err := cc.Namespace()
		if err != nil || ns == "" {
			ns = "default"
		}
		return rc, ns, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, "", fmt.Errorf("VIPD_KUBECONFIG is empty and vipd is not running in a pod (%w): set VIPD_KUBECONFIG to a kubeconfig file", err)
	}
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
			ns = strings.TrimSpace(string(b))
		}
	}
	if ns == "" {
		ns = "default"
	}
	return rc, ns, nil
}

// Run runs the enabled controllers until ctx ends, acting only while this
// instance holds the Lease; after losing it, it stands by and competes
// again. Metrics (FLIPOP's flipop_* names) are registered on reg when it is
// not nil. It returns nil when ctx ends, and an error for bad configuration
// (no usable provider, an unreadable kubeconfig, not in a pod without one).
// A kubeconfig file that does not exist yet, an unreachable API and
// missing CRDs are waited for (logged), since vipd on a control-plane node
// starts before the cluster does.
func Run(ctx context.Context, cfg Config, logger *slog.Logger, reg prometheus.Registerer) error {
	if len(cfg.Controllers) == 0 {
		return nil
	}
	if logger == nil {
		logger = slog.Default()
	}
	log := logger.With("component", "kube")
	cfg = cfg.withDefaults()
	enabled := map[string]bool{}
	for _, c := range cfg.Controllers {
		switch c {
		case ControllerFloatingIPPool, ControllerNodeDNSRecordSet, ControllerServices, ControllerIPAM:
		case ControllerCordon:
			continue // not Run's (cordon.Watch)
		default:
			return fmt.Errorf("VIPD_CONTROLLERS: unknown controller %q; accepted: %s", c, acceptedControllers)
		}
		enabled[c] = true
	}
	flipop := enabled[ControllerFloatingIPPool] || enabled[ControllerNodeDNSRecordSet]
	pools := enabled[ControllerServices] || enabled[ControllerIPAM]
	// On a control-plane node vipd starts before the cluster exists: wait
	// for the kubeconfig file (kubeadm writes it) and for the API.
	rc, ns, err := cfg.restConfig()
	for wait := time.Second; err != nil && errors.Is(err, fs.ErrNotExist); wait = min(2*wait, 30*time.Second) {
		log.Warn("kube controllers waiting for the kubeconfig file", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		rc, ns, err = cfg.restConfig()
	}
	if err != nil {
		return err
	}
	if cfg.LeaseNamespace == "" {
		cfg.LeaseNamespace = ns
	}
	rc.UserAgent = cfg.UserAgent
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes dynamic client: %w", err)
	}

	pm := newProviderMetrics()
	var prov providers
	if flipop {
		// The pool controllers need no provider.
		if prov, err = buildProviders(cfg, pm); err != nil {
			return err
		}
	}
	col := newCollector()
	var poolMetrics *ipam.Metrics
	if pools && reg != nil {
		poolMetrics = ipam.NewMetrics()
		if err := reg.Register(poolMetrics); err != nil {
			return fmt.Errorf("register pool metrics: %w", err)
		}
		defer reg.Unregister(poolMetrics)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{pm, col} {
			if err := reg.Register(c); err != nil {
				return fmt.Errorf("register kube metrics: %w", err)
			}
		}
		defer reg.Unregister(pm)
		defer reg.Unregister(col)
	}
	// Wait for the API and the CRDs (a definitive "not installed" is
	// logged with the fix; the CRDs may be applied after vipd starts).
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		err := checkCRDs(kc, enabled)
		if err == nil {
			break
		}
		log.Warn("kube controllers waiting for the API and the CRDs", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}

	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1ObjectMeta(cfg.LeaseNamespace, cfg.LeaseName),
		Client:     kc.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	timing := dnsTiming{Debounce: cfg.DNSDebounce, MaxDelay: cfg.DNSMaxDelay, Resync: max(cfg.DNSResync, 0)}
	log.Info("kube controllers waiting for leadership", "lease", cfg.LeaseNamespace+"/"+cfg.LeaseName,
		"identity", cfg.Identity, "controllers", cfg.Controllers, "providers", prov.names())
	for ctx.Err() == nil {
		// term tracks this election round's controllers, so the next round
		// never overlaps with them.
		var (
			termMu  sync.Mutex
			over    bool
			running chan struct{}
			runErr  error
		)
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			Name:            cfg.LeaseName,
			LeaseDuration:   cfg.LeaseDuration,
			RenewDeadline:   cfg.RenewDeadline,
			RetryPeriod:     cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					termMu.Lock()
					if over {
						termMu.Unlock()
						return
					}
					done := make(chan struct{})
					running = done
					termMu.Unlock()
					defer close(done)
					log.Info("leading: starting kube controllers", "identity", cfg.Identity)
					err := runTerm(lctx, func(ctx context.Context) error {
						if !flipop {
							return nil
						}
						op, err := newOperator(log, kc, dc, prov, cfg.Namespace, enabled, timing, cfg.Workers)
						if err != nil {
							return err
						}
						col.set(op)
						defer col.set(nil)
						return op.run(ctx)
					}, func(ctx context.Context) error {
						if !pools {
							return nil
						}
						return ipam.Run(ctx, kc, dc, ipam.Options{
							Services: enabled[ControllerServices], CAPI: enabled[ControllerIPAM],
							DefaultClass: cfg.ServicesDefaultClass, Workers: cfg.Workers, Log: logger,
							Metrics: poolMetrics,
						})
					})
					if err != nil {
						termMu.Lock()
						runErr = err
						termMu.Unlock()
					}
				},
				OnStoppedLeading: func() { log.Info("not leading: kube controllers stopped", "identity", cfg.Identity) },
				OnNewLeader: func(id string) {
					if id != cfg.Identity {
						log.Info("kube controllers led by another instance", "leader", id)
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		le.Run(ctx)
		termMu.Lock()
		over = true
		wait := running
		termMu.Unlock()
		if wait != nil {
			<-wait
		}
		termMu.Lock()
		err = runErr
		termMu.Unlock()
		if err != nil {
			return err
		}
		if ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(cfg.RetryPeriod):
			}
		}
	}
	return nil
}

func buildProviders(cfg Config, pm *providerMetrics) (providers, error) {
	p := providers{ip: map[string]IPProvider{}, dns: map[string]DNSProvider{}}
	if cfg.DOToken != "" {
		do, err := newDigitalOcean(cfg.DOToken, cfg.DOAPIURL, cfg.UserAgent, cfg.ProviderTimeout)
		if err != nil {
			return p, err
		}
		p.ip[ProviderDigitalOcean] = instrumentedIP{name: ProviderDigitalOcean, inner: do, metrics: pm}
		p.dns[ProviderDigitalOcean] = instrumentedDNS{name: ProviderDigitalOcean, inner: do, metrics: pm}
	}
	if cfg.CloudflareToken != "" {
		cf, err := newCloudflare(cfg.CloudflareToken, cfg.CloudflareAPIURL, cfg.UserAgent, cfg.ProviderTimeout)
		if err != nil {
			return p, err
		}
		p.dns[ProviderCloudflare] = instrumentedDNS{name: ProviderCloudflare, inner: cf, metrics: pm}
	}
	if len(p.ip) == 0 && len(p.dns) == 0 {
		return p, errors.New("kube controllers need a provider token: set DIGITALOCEAN_ACCESS_TOKEN (or VIPD_DO_TOKEN_FILE) and/or CLOUDFLARE_API_TOKEN (or CLOUDFLARE_TOKEN)")
	}
	return p, nil
}

// runTerm runs the controller groups of one leadership term side by side
// until ctx ends or one fails (which stops the others); it returns when
// all have returned, with the first error.
func runTerm(ctx context.Context, groups ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(groups))
	for _, g := range groups {
		go func() {
			err := g(ctx)
			if err != nil {
				cancel()
			}
			errs <- err
		}()
	}
	var first error
	for range groups {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// checkCRDs fails early, with the fix, when a CRD is missing: otherwise the
// informers would wait forever.
func checkCRDs(kc kubernetes.Interface, enabled map[string]bool) error {
	if err := checkPoolCRDs(kc, enabled); err != nil {
		return err
	}
	if !enabled[ControllerFloatingIPPool] && !enabled[ControllerNodeDNSRecordSet] {
		return nil
	}
	res, err := kc.Discovery().ServerResourcesForGroupVersion(Group + "/" + Version)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("discover %s/%s: %w", Group, Version, err)
	}
	have := map[string]bool{}
	if res != nil {
		for _, r := range res.APIResources {
			have[r.Name] = true
		}
	}
	for ctrl, resName := range map[string]string{
		ControllerFloatingIPPool:   FloatingIPPoolResource.Resource,
		ControllerNodeDNSRecordSet: NodeDNSRecordSetResource.Resource,
	} {
		if enabled[ctrl] && !have[resName] {
			return fmt.Errorf("controller %s: the %s.%s CRD is not installed (kubectl apply -f deploy/kube/crds/)", ctrl, resName, Group)
		}
	}
	return nil
}

// checkPoolCRDs: services and ipam need vipd.io's IPPool and IPAllocation;
// ipam also needs Cluster API's IPAM CRDs (served at v1beta1).
func checkPoolCRDs(kc kubernetes.Interface, enabled map[string]bool) error {
	if !enabled[ControllerServices] && !enabled[ControllerIPAM] {
		return nil
	}
	need := []struct {
		gv, resource, fix string
	}{
		{v1alpha1.Group + "/" + v1alpha1.Version, v1alpha1.IPPoolResource.Resource, "kubectl apply -f deploy/kube/crds/"},
		{v1alpha1.Group + "/" + v1alpha1.Version, v1alpha1.IPAllocationResource.Resource, "kubectl apply -f deploy/kube/crds/"},
	}
	if enabled[ControllerIPAM] {
		fix := "install Cluster API's IPAM CRDs (clusterctl init, or config/crd/bases/ipam.cluster.x-k8s.io_*.yaml of cluster-api)"
		need = append(need,
			struct{ gv, resource, fix string }{ipam.IPAddressClaimResource.GroupVersion().String(), ipam.IPAddressClaimResource.Resource, fix},
			struct{ gv, resource, fix string }{ipam.IPAddressResource.GroupVersion().String(), ipam.IPAddressResource.Resource, fix})
	}
	for _, n := range need {
		res, err := kc.Discovery().ServerResourcesForGroupVersion(n.gv)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("discover %s: %w", n.gv, err)
		}
		found := false
		if res != nil {
			for _, r := range res.APIResources {
				found = found || r.Name == n.resource
			}
		}
		if !found {
			return fmt.Errorf("the %s CRD (%s) is not installed (%s)", n.resource, n.gv, n.fix)
		}
	}
	return nil
}
