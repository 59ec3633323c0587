// Package monitoring checks deploy/monitoring/: the alerting rules pass
// promtool's checks and unit tests, the PrometheusRule manifest carries the
// same rules, the dashboard's queries parse, and every metric the rules and
// the dashboard name is exported by a running vipd (scraped in l2, bgp with
// BFD, and cloud mode in a lab).
package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "deploy", "monitoring")); err != nil {
		t.Fatalf("repository root not found at %s: %v", dir, err)
	}
	return dir
}

// promtool is the binary from VIPD_PROMTOOL, .cache/promtool/promtool
// (make promtool) or PATH.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("VIPD_PROMTOOL"); p != "" {
		return p
	}
	if p := filepath.Join(repoRoot(t), ".cache", "promtool", "promtool"); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	testenv.Missing(t, "promtool not found: run make promtool (it extracts it from Debian's prometheus package) or set VIPD_PROMTOOL")
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func monitoringFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "monitoring", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRulesPromtool(t *testing.T) {
	tool := promtool(t)
	dir := filepath.Join(repoRoot(t), "deploy", "monitoring")
	for _, args := range [][]string{
		{"check", "rules", "vipd-rules.yaml"},
		{"test", "rules", "vipd-rules.test.yaml"},
	} {
		cmd := exec.Command(tool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestRulesCoverEveryAlert keeps the list of alerts the issue asks for and
// the unit tests in step with the rules file.
func TestRulesCoverEveryAlert(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(monitoringFile(t, "vipd-rules.yaml"), &rules); err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
		}
	}
	sort.Strings(alerts)
	want := []string{"VIPDAddressConflict", "VIPDAddressesNotReceived", "VIPDAddressesUnreachable", "VIPDAnnouncementNotReceived", "VIPDBFDFlapping", "VIPDCloudAPIErrors", "VIPDConflict", "VIPDControllersNotLeading", "VIPDDuplicateNodeName",
		"VIPDHealthFailingEverywhere", "VIPDMoreThanOneHolder", "VIPDNoHolder", "VIPDNodeCannotHoldVIP", "VIPDQuorumLostOnMajority", "VIPDVIPUnreachable"}
	if !reflect.DeepEqual(alerts, want) {
		t.Errorf("alerts %v, want %v", alerts, want)
	}
	tests := string(monitoringFile(t, "vipd-rules.test.yaml"))
	for _, a := range alerts {
		// Each alert is tested both firing and silent.
		if n := strings.Count(tests, "alertname: "+a+"\n"); n < 2 {
			t.Errorf("vipd-rules.test.yaml evaluates %s %d times, want firing and silent cases", a, n)
		}
	}
}

func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	var file struct {
		Groups any `json:"groups"`
	}
	var pr struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			Groups any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(monitoringFile(t, "vipd-rules.yaml"), &file); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(monitoringFile(t, "prometheusrule.yaml"), &pr); err != nil {
		t.Fatal(err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Errorf("prometheusrule.yaml is %s %s", pr.APIVersion, pr.Kind)
	}
	if !reflect.DeepEqual(file.Groups, pr.Spec.Groups) {
		t.Error("prometheusrule.yaml's groups differ from vipd-rules.yaml's; regenerate them in deploy/monitoring with\n" +
			"  { sed '/^spec:/q' prometheusrule.yaml; sed -n '/^groups:/,$p' vipd-rules.yaml | sed 's/^/  /'; } > new && mv new prometheusrule.yaml")
	}
}

// dashboardExprs returns every query of the dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	var d struct {
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(monitoringFile(t, "vipd-dashboard.json"), &d); err != nil {
		t.Fatalf("vipd-dashboard.json: %v", err)
	}
	var exprs []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

// TestDashboardQueriesParse has promtool parse every dashboard query (as
// recording rules, with Grafana's variables replaced).
func TestDashboardQueriesParse(t *testing.T) {
	tool := promtool(t)
	exprs := dashboardExprs(t)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	r := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*")
	for i, e := range exprs {
		q, _ := json.Marshal(r.Replace(e))
		fmt.Fprintf(&b, "      - record: dashboard:query%d\n        expr: %s\n", i, q)
	}
	f := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("dashboard queries do not parse: %v\n%s\n%s", err, out, b.String())
	}
}

var metricName = regexp.MustCompile(`\b(?:vipd|flipop|process|go)_[a-z0-9_]+\b`)

// usedNames returns the metric names the rules and the dashboard query.
func usedNames(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	for _, e := range dashboardExprs(t) {
		for _, n := range metricName.FindAllString(e, -1) {
			used[n] = append(used[n], "dashboard")
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(monitoringFile(t, "vipd-rules.yaml"), &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, n := range metricName.FindAllString(r.Expr, -1) {
				used[n] = append(used[n], r.Alert)
			}
		}
	}
	return used
}

// notScraped are names the lab cannot make a vipd export, with the reason.
// Keep this list short: every entry is a name no test sees exported.
var notScraped = map[string]string{
	// Exported only by the vipd-controllers replica that leads, per
	// FloatingIPPool / NodeDNSRecordSet object (controllers/kube/metrics.go); the lab
	// has no Kubernetes API. kube/ tests cover the collector.
	"flipop_floatingippoolcontroller_unfulfilled_ips": "controllers leader only",
	"flipop_nodednsrecordset_records":                 "controllers leader only",
}

// TestMetricNamesExported runs vipd in l2 (with a conflict), bgp with BFD
// and cloud mode in a lab, scrapes /metrics of each and checks that every
// metric the rules and the dashboard use is among the exported names.
func TestMetricNamesExported(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.Short(t)
	testenv.RequireCommands(t, "ip", "curl")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	used := usedNames(t)
	if len(used) < 10 {
		t.Fatalf("only %d metric names found in the rules and the dashboard: %v", len(used), used)
	}
	bin, err := lab.VipdBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := lab.New(t, lab.Options{Nodes: 4, Client: true})
	for _, n := range l.Nodes {
		if _, err := n.StartAPIServer("0.0.0.0:6443", lab.OK); err != nil {
			t.Fatal(err)
		}
	}
	n1, n2, n3, n4, client := l.Nodes[0], l.Nodes[1], l.Nodes[2], l.Nodes[3], l.Client
	var procs []*lab.Proc
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range procs {
				t.Logf("--- %s:\n%s", p.Name, p.Output())
			}
		}
	})
	start := func(h *lab.Host, env ...string) {
		p, err := h.StartVipd(bin, env...)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
	}

	// l2 on n1 and n4 (a gossip cluster), their VIP first held by the
	// client: a conflict, then the client lets go and one of them binds it.
	vip := l.VIP4(80)
	mon, err := l.Monitor(vip)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := client.Output(ctx, "ip", "addr", "add", vip.String()+"/32", "dev", client.Link); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	start(n1, "VIPD_ADDRESS="+vip.String()+"/32", "VIPD_HEALTH_INTERVAL=200ms", "VIPD_PEERS="+n4.IPv4.String())
	start(n4, "VIPD_ADDRESS="+vip.String()+"/32", "VIPD_HEALTH_INTERVAL=200ms", "VIPD_PEERS="+n1.IPv4.String())
	// Only the elected node probes before binding.
	waitMetric(ctx, t, "vipd_conflicts_total{", n1, n4)
	if out, err := client.Output(ctx, "ip", "addr", "del", vip.String()+"/32", "dev", client.Link); err != nil {
		t.Fatalf("%v: %s", err, out)
	}

	// bgp with BFD on n2: the client is the (silent) router.
	start(n2, "VIPD_MODE=bgp", "VIPD_ADDRESS="+l.VIP4(81).String()+"/32", "VIPD_BGP_LOCAL_AS=65010",
		"VIPD_BGP_PEERS="+client.IPv4.String()+":65000", "VIPD_BFD_ENABLED=true", "VIPD_HEALTH_INTERVAL=200ms")

	// cloud on n3 against the fake DigitalOcean API in the client namespace.
	const token, reserved = "dop_v1_lab", "192.0.2.10"
	fake, err := fakedo.New(fakedo.Options{Token: token, Listen: client.Listen,
		Addr: client.IPv4.String() + ":0", MetadataAddr: client.IPv4.String() + ":0"})
	if err != nil {
		t.Fatal(err)
	}
	l.OnClose(fake.Close)
	fake.AddDroplet(fakedo.Droplet{ID: 1003, Name: n3.Name, PublicIPv4: n3.IPv4.String()})
	fake.AddReservedIP(reserved, 0)
	start(n3, "VIPD_MODE=cloud", "VIPD_ADDRESS="+reserved+"/32", "DIGITALOCEAN_ACCESS_TOKEN="+token, "VIPD_DO_TOKEN_FILE=",
		"VIPD_DO_API_URL="+fake.URL(), "VIPD_DO_METADATA_URL="+fake.MetadataURL(1003), "VIPD_DO_DROPLET_ID=",
		"VIPD_HEALTH_INTERVAL=200ms")

	// Wait for the states the rules look at, then scrape.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if _, err := mon.WaitStable(wctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitMetric(ctx, t, "vipd_cluster_quorum 1", n1)
	waitMetric(ctx, t, "vipd_bfd_session_up{", n2)
	waitMetric(ctx, t, `vipd_vip_held{mode="cloud",vip="`+reserved+`/32"} 1`, n3)
	exported := map[string][]string{}
	for _, h := range []*lab.Host{n1, n2, n3, n4} {
		for _, n := range sampleNames(scrape(ctx, t, h)) {
			exported[n] = append(exported[n], h.Name)
		}
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if why, ok := notScraped[n]; ok {
			t.Logf("%-50s not checked (%s), used by %v", n, why, used[n])
			continue
		}
		if len(exported[n]) == 0 {
			t.Errorf("%s (used by %v) is not exported by vipd in any mode", n, used[n])
			continue
		}
		t.Logf("%-50s exported by %v", n, exported[n])
	}
	for n := range notScraped {
		if _, ok := used[n]; !ok {
			t.Errorf("notScraped lists %s, which nothing uses", n)
		}
	}
}

// scrape returns the text of the host's vipd /metrics.
func scrape(ctx context.Context, t *testing.T, h *lab.Host) string {
	t.Helper()
	out, err := h.Output(ctx, "curl", "-sS", "-m", "3", "--fail", "http://127.0.0.1:9469/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", h.Name, err)
	}
	return string(out)
}

// waitMetric waits until one of the hosts' /metrics contains substr.
func waitMetric(ctx context.Context, t *testing.T, substr string, hosts ...*lab.Host) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	last := map[string]string{}
	for time.Now().Before(deadline) {
		for _, h := range hosts {
			out, err := h.Output(ctx, "curl", "-sS", "-m", "3", "--fail", "http://127.0.0.1:9469/metrics")
			if err == nil && strings.Contains(string(out), substr) {
				return
			}
			last[h.Name] = fmt.Sprintf("%s%v", out, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%q not in /metrics within 30s; last scrapes:\n%v", substr, last)
}

// sampleNames returns the names of the samples in a text exposition (with
// _bucket, _sum and _count for histograms, as queries name them).
func sampleNames(text string) []string {
	seen := map[string]bool{}
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out
}
