package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/child"
)

// controllersBinary finds vipd-controllers: $VIPD_CONTROLLERS_BINARY, next
// to this executable, or /usr/lib/vipd/vipd-controllers.
func controllersBinary() (string, error) {
	if p := os.Getenv("VIPD_CONTROLLERS_BINARY"); p != "" {
		return p, nil
	}
	var tried []string
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "vipd-controllers")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		tried = append(tried, p)
	}
	const lib = "/usr/lib/vipd/vipd-controllers"
	if _, err := os.Stat(lib); err == nil {
		return lib, nil
	}
	tried = append(tried, lib)
	return "", fmt.Errorf("VIPD_CONTROLLERS is set but vipd-controllers was not found (tried %v; set VIPD_CONTROLLERS_BINARY)", tried)
}

// controllers supervises the vipd-controllers child process
// (internal/child): it passes the effective configuration in the
// environment and gathers the child's metrics for vipd's /metrics.
type controllers struct {
	bin    string
	cfg    *config.Config
	log    *slog.Logger
	socket string // abstract unix socket for the child's metrics
	client *http.Client
}

func newControllers(c *config.Config, log *slog.Logger) (*controllers, error) {
	bin, err := controllersBinary()
	if err != nil {
		return nil, usageError{err}
	}
	sock := fmt.Sprintf("@vipd-controllers-%d", os.Getpid())
	return &controllers{bin: bin, cfg: c, log: log.With("component", "controllers"), socket: sock,
		client: &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
		}},
	}, nil
}

// Run keeps the child running until ctx is done (internal/child). A
// child that exits with code 2 (invalid configuration) is not restarted.
func (k *controllers) Run(ctx context.Context) error {
	k.log.Info("starting the Kubernetes controllers", "controllers", k.cfg.Controllers)
	sup := child.New(child.Config{Name: "Kubernetes controllers", Path: k.bin,
		Env:         append(append(os.Environ(), k.cfg.Environ()...), "VIPD_CONTROLLERS_METRICS_SOCKET="+k.socket),
		StopTimeout: controllersStopTimeout, // a leader releases its lease
		Stderr:      os.Stderr,              // the child writes vipd's own log records
		Final: func(err error) error {
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() == exitConfig {
				return usageError{fmt.Errorf("vipd-controllers rejected the configuration (see its message above)")}
			}
			return nil
		},
	}, k.log)
	return sup.Run(ctx)
}

// Gather implements prometheus.Gatherer by scraping the child. A child
// that is not up contributes nothing.
func (k *controllers) Gather() ([]*dto.MetricFamily, error) {
	resp, err := k.client.Get("http://controllers/metrics")
	if err != nil {
		return nil, nil
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("controllers metrics: %w", err)
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}

var _ prometheus.Gatherer = (*controllers)(nil)
