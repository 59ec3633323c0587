package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/child"
	"github.com/vipd/vipd/manifest"
)

// TestStopBudgetFitsEveryPackaging: vipd ends its own stop (stopTimeout)
// before the unit's TimeoutStopSec, the static pod's grace period and the
// Helm chart's grace period kill it, with half a second to spare for the
// exit itself; and the controllers child, stopped after the VIPs were
// released and the cluster left, gets its kill within the budget. A
// budget past the unit's (15 s against 5 s, until 2026-12-02) let systemd
// kill a stop that waited for the child: the unit failed on an ordinary
// `systemctl stop` and the child was killed without its own log line.
func TestStopBudgetFitsEveryPackaging(t *testing.T) {
	const margin = 500 * time.Millisecond
	seconds := func(what, file, expr string) time.Duration {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("..", "..", file))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(expr).FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s: no %s in %s", what, expr, file)
		}
		n, err := strconv.Atoi(string(m[1]))
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(n) * time.Second
	}
	pod, err := manifest.StaticPod([]manifest.Var{{Name: "VIPD_ADDRESS", Value: "10.0.0.100/32"}}, manifest.PodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.TerminationGracePeriodSeconds == nil {
		t.Fatal("the static pod sets no terminationGracePeriodSeconds (Kubernetes' 30 s would apply)")
	}
	for _, b := range []struct {
		what  string
		limit time.Duration
	}{
		{"vipd.service TimeoutStopSec", seconds("unit", "packaging/vipd.service", `(?m)^TimeoutStopSec=(\d+)$`)},
		{"static pod terminationGracePeriodSeconds", time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second},
		{"Helm node terminationGracePeriodSeconds", seconds("chart", "deploy/helm/vipd/templates/node.yaml", `terminationGracePeriodSeconds: (\d+)`)},
	} {
		if stopTimeout+margin > b.limit {
			t.Errorf("stopTimeout %v + %v does not fit the %s (%v)", stopTimeout, margin, b.what, b.limit)
		}
	}
	// One child stuck on its stop leaves the VIPs' release its full time.
	for _, c := range []struct {
		child string
		stop  time.Duration
	}{{"controllers", controllersStopTimeout}, {"egress or pools feed (the default)", child.DefaultStopTimeout}} {
		if releaseTimeout+c.stop+margin > stopTimeout {
			t.Errorf("the VIP release (%v) and the %s child's stop (%v) do not fit stopTimeout %v", releaseTimeout, c.child, c.stop, stopTimeout)
		}
	}
}
