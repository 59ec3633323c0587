// Package helm tests the chart in deploy/helm/vipd with the helm CLI (built
// from the Go module proxy by hack/k8s-binaries.sh, cached in .cache/): it lints,
// renders with default and full values, refuses bad values with one clear
// message, renders nothing less than deploy/kube (every CRD, RBAC rule, env
// and argument), and installs into a real kube-apiserver + etcd where the
// controllers run with the chart's own ServiceAccount and give a
// LoadBalancer Service its address.
package helm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// HelmVersion is the helm release hack/k8s-binaries.sh builds (keep in step).
const HelmVersion = "v3.19.5"

const (
	release   = "vipd"
	namespace = "vipd-system"
)

var env kubetest.Env

// vipdBuild is vipd and vipd-controllers, built once on first use.
var vipdBuild = lab.Build{Controllers: true}

func TestMain(m *testing.M) {
	code := env.Main(m)
	vipdBuild.Remove()
	os.Exit(code)
}

func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func chartDir(t testing.TB) string { return filepath.Join(repoRoot(t), "deploy", "helm", "vipd") }

// helmBinary is $VIPD_HELM, or the binary `make helm` (hack/k8s-binaries.sh) caches.
func helmBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("VIPD_HELM"); p != "" {
		return p
	}
	p := filepath.Join(repoRoot(t), ".cache", "helm-"+HelmVersion)
	if _, err := os.Stat(p); err != nil {
		testenv.Missing(t, "helm %s not found at %s: run make helm (hack/k8s-binaries.sh builds it from the Go module proxy) or set VIPD_HELM", HelmVersion, p)
	}
	return p
}

// helm runs the helm CLI with an empty home (no repositories, no plugins).
func helm(t testing.TB, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out.String(), nil
}

// render runs helm template with the CRDs and returns the objects.
func render(t testing.TB, args ...string) []*unstructured.Unstructured {
	t.Helper()
	return renderRelease(t, release, namespace, args...)
}

func renderRelease(t testing.TB, name, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t, append([]string{"template", name, chartDir(t), "--namespace", ns, "--include-crds"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatalf("decode helm template output: %v\n%s", err, out)
	}
	return objs
}

func decode(s string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(s), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(obj) > 0 {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

func fullValues(t testing.TB) string { return filepath.Join(chartDir(t), "ci", "full-values.yaml") }

// find returns the one object of kind whose name ends with suffix.
func find(t testing.TB, objs []*unstructured.Unstructured, kind, suffix string) *unstructured.Unstructured {
	t.Helper()
	var got []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && strings.HasSuffix(o.GetName(), suffix) {
			got = append(got, o)
		}
	}
	if len(got) != 1 {
		t.Fatalf("%d %s objects named *%s, want 1", len(got), kind, suffix)
	}
	return got[0]
}

func kinds(objs []*unstructured.Unstructured) map[string]int {
	m := map[string]int{}
	for _, o := range objs {
		m[o.GetKind()]++
	}
	return m
}

// The chart carries copies of deploy/kube/crds and deploy/monitoring (helm
// reads only files inside the chart); they must not drift.
func TestChartCopiesMatchDeploy(t *testing.T) {
	root := repoRoot(t)
	pairs := map[string]string{
		"deploy/monitoring/vipd-rules.yaml":     "deploy/helm/vipd/files/vipd-rules.yaml",
		"deploy/monitoring/vipd-dashboard.json": "deploy/helm/vipd/files/vipd-dashboard.json",
	}
	crds, _ := filepath.Glob(filepath.Join(root, "deploy/kube/crds/*.yaml"))
	if len(crds) < 5 {
		t.Fatalf("found only %v", crds)
	}
	for _, c := range crds {
		pairs["deploy/kube/crds/"+filepath.Base(c)] = "deploy/helm/vipd/crds/" + filepath.Base(c)
	}
	chartCRDs, _ := filepath.Glob(filepath.Join(root, "deploy/helm/vipd/crds/*"))
	if len(chartCRDs) != len(crds) {
		t.Errorf("deploy/helm/vipd/crds has %d files, deploy/kube/crds %d", len(chartCRDs), len(crds))
	}
	for src, dst := range pairs {
		a, err := os.ReadFile(filepath.Join(root, src))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, dst))
		if err != nil {
			t.Errorf("%s: %v (copy it: cp %s %s)", dst, err, src, dst)
			continue
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: cp %s %s", dst, src, src, dst)
		}
	}
}

func TestLint(t *testing.T) {
	for name, args := range map[string][]string{
		"default": nil,
		"full":    {"-f", fullValues(t)},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := helm(t, append([]string{"lint", "--strict", chartDir(t)}, args...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint:\n%s", out)
			}
		})
	}
}

// Bad values stop helm with one message naming the value and what is
// accepted; nothing is rendered.
func TestBadValuesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown mode", []string{"--set", "node.mode=vrrp"}, []string{"/node/mode", "'l2', 'bgp'"}},
		{"log format", []string{"--set", "controllers.logFormat=xml"}, []string{"/controllers/logFormat", "'text', 'json'"}},
		{"port out of range", []string{"--set", "controllers.metricsPort=70000"}, []string{"/controllers/metricsPort"}},
		{"env name not a variable", []string{"--set", "controllers.env.vipd_log_level=debug"}, []string{"vipd_log_level", "^[A-Z][A-Z0-9_]*$"}},
		{"controller not a boolean", []string{"--set-string", "controllers.ipam=yes"}, []string{"/controllers/ipam", "boolean"}},
		{"controllers through env", []string{"--set", "controllers.env.VIPD_CONTROLLERS=ipam"}, []string{"controllers.env.VIPD_CONTROLLERS", "controllers.ipam"}},
		{"node feature through env", []string{"--set", "node.enabled=true,node.env.VIPD_EGRESS_POLICIES=on"}, []string{"node.env.VIPD_EGRESS_POLICIES", "node.egressPolicies"}},
		{"no controller", []string{"--set", "controllers.services=false"}, []string{"no controller is", "controllers.services"}},
		{"flipop without token", []string{"--set", "controllers.floatingippool=true"}, []string{"controllers.providerSecret.name", "DIGITALOCEAN_ACCESS_TOKEN"}},
		{"peers without gossip key", []string{"--set", "node.enabled=true,node.peers=192.0.2.11"}, []string{"node.gossipKey.existingSecret", "vipd keygen"}},
		{"egress without an elected address", []string{"--set", "node.enabled=true,node.egressPolicies=true"}, []string{"node.egressPolicies", "node.address", "VIPD_EGRESS"}},
		{"node with nothing to do", []string{"--set", "node.enabled=true,node.pools=false"}, []string{"node.pools", "node.egressPolicies"}},
		{"pod monitor without the node form", []string{"--set", "metrics.podMonitor.enabled=true"}, []string{"metrics.podMonitor.enabled", "node.enabled"}},
		{"service monitor without service", []string{"--set", "metrics.serviceMonitor.enabled=true,metrics.service.enabled=false"}, []string{"metrics.service.enabled"}},
		{"apiServer not a URL", []string{"--set", "node.apiServer=kubernetes.default"}, []string{"/node/apiServer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helm(t, append([]string{"template", release, chartDir(t), "--namespace", namespace}, tc.args...)...)
			if err == nil {
				t.Fatalf("helm template accepted %v:\n%s", tc.args, out)
			}
			if out != "" {
				t.Errorf("helm template printed objects for bad values:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q: %v", w, err)
				}
			}
		})
	}
}

// With default values: the CRDs, the services controller and its RBAC, a
// metrics Service; nothing that needs prometheus-operator or runs on nodes.
func TestTemplateDefaults(t *testing.T) {
	objs := render(t)
	want := map[string]int{
		"CustomResourceDefinition": 5, "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1,
		"Role": 1, "RoleBinding": 1, "Deployment": 1, "Service": 1,
	}
	if got := kinds(objs); !reflect.DeepEqual(got, want) {
		t.Errorf("kinds %v, want %v", got, want)
	}
	d := find(t, objs, "Deployment", "-controllers")
	envs := containerEnv(t, d)
	if envs["VIPD_CONTROLLERS"] != "services" {
		t.Errorf("VIPD_CONTROLLERS=%q, want services", envs["VIPD_CONTROLLERS"])
	}
	img, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if got := img[0].(map[string]any)["image"]; got != "ghcr.io/vipd/vipd:latest" {
		t.Errorf("image %v, want ghcr.io/vipd/vipd:latest (appVersion)", got)
	}
	for _, o := range objs {
		if ns := o.GetNamespace(); ns != "" && ns != namespace {
			t.Errorf("%s %s in namespace %s, want the release namespace %s", o.GetKind(), o.GetName(), ns, namespace)
		}
	}
}

// rule is one (apiGroup, resource, verb) a ClusterRole grants.
type rule struct{ group, resource, verb string }

func rulesOf(t testing.TB, o *unstructured.Unstructured) map[rule]bool {
	t.Helper()
	rs, _, err := unstructured.NestedSlice(o.Object, "rules")
	if err != nil {
		t.Fatal(err)
	}
	out := map[rule]bool{}
	for _, r := range rs {
		m := r.(map[string]any)
		for _, g := range strs(m["apiGroups"]) {
			for _, res := range strs(m["resources"]) {
				for _, v := range strs(m["verbs"]) {
					out[rule{g, res, v}] = true
				}
			}
		}
	}
	return out
}

func strs(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

func diffRules(a, b map[rule]bool) []string {
	var out []string
	for r := range a {
		if !b[r] {
			out = append(out, fmt.Sprintf("%s/%s:%s", r.group, r.resource, r.verb))
		}
	}
	sort.Strings(out)
	return out
}

func containerEnv(t testing.TB, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%s has %d containers", o.GetName(), len(cs))
	}
	out := map[string]any{}
	env, _ := cs[0].(map[string]any)["env"].([]any)
	for _, e := range env {
		m := e.(map[string]any)
		if v, ok := m["value"]; ok {
			out[m["name"].(string)] = v
		} else {
			out[m["name"].(string)] = m["valueFrom"]
		}
	}
	return out
}

// Nothing of deploy/kube is lost: with every part switched on, the chart's
// CRDs are deploy/kube's, its ClusterRoles grant exactly deploy/kube's
// rules (no more), and the controllers' container has every env entry,
// argument, port, probe, security setting and mount of deployment.yaml.
func TestTemplateKeepsDeployKube(t *testing.T) {
	root := repoRoot(t)
	objs := render(t, "-f", fullValues(t))
	shipped, err := kubetest.ReadObjects(append(glob(t, root, "deploy/kube/crds/*.yaml"),
		filepath.Join(root, "deploy/kube/rbac.yaml"), filepath.Join(root, "deploy/kube/rbac-pools.yaml"),
		filepath.Join(root, "deploy/kube/egresspolicy-rbac.yaml"), filepath.Join(root, "deploy/kube/deployment.yaml"))...)
	if err != nil {
		t.Fatal(err)
	}
	crds := 0
	for _, s := range shipped {
		switch s.GetKind() {
		case "CustomResourceDefinition":
			crds++
			got := find(t, objs, "CustomResourceDefinition", s.GetName())
			if !reflect.DeepEqual(got.Object, s.Object) {
				t.Errorf("CRD %s differs from deploy/kube's", s.GetName())
			}
		case "ClusterRole":
			// deploy/kube names them vipd-controllers, vipd-pools-feed,
			// vipd-egress; the chart <release>-controllers and so on.
			suffix := strings.TrimPrefix(s.GetName(), "vipd")
			got := find(t, objs, "ClusterRole", suffix)
			want, have := rulesOf(t, s), rulesOf(t, got)
			if lost := diffRules(want, have); len(lost) > 0 {
				t.Errorf("ClusterRole %s lacks deploy/kube's %v", got.GetName(), lost)
			}
			if extra := diffRules(have, want); len(extra) > 0 {
				t.Errorf("ClusterRole %s grants more than deploy/kube: %v", got.GetName(), extra)
			}
			binding := find(t, objs, "ClusterRoleBinding", suffix)
			if ref, _, _ := unstructured.NestedString(binding.Object, "roleRef", "name"); ref != got.GetName() {
				t.Errorf("ClusterRoleBinding %s binds %s", binding.GetName(), ref)
			}
		case "Role":
			got := find(t, objs, "Role", "-leader-election")
			if lost := diffRules(rulesOf(t, s), rulesOf(t, got)); len(lost) > 0 {
				t.Errorf("Role %s lacks %v", got.GetName(), lost)
			}
		case "Deployment":
			got := find(t, objs, "Deployment", "-controllers")
			compareContainer(t, s, got)
		}
	}
	if crds != 5 {
		t.Errorf("deploy/kube has %d CRDs, want 5", crds)
	}

	// The monitoring objects carry deploy/monitoring's rules and dashboard.
	var rulesFile struct {
		Groups any `json:"groups"`
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy/monitoring/vipd-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rulesFile); err != nil {
		t.Fatal(err)
	}
	pr := find(t, objs, "PrometheusRule", "vipd")
	groups, _, _ := unstructured.NestedSlice(pr.Object, "spec", "groups")
	if !reflect.DeepEqual(any(groups), rulesFile.Groups) {
		t.Errorf("PrometheusRule groups differ from deploy/monitoring/vipd-rules.yaml")
	}
	if l := pr.GetLabels()["release"]; l != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule label release=%q, want the value's kube-prometheus-stack", l)
	}
	dash, err := os.ReadFile(filepath.Join(root, "deploy/monitoring/vipd-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	cm := find(t, objs, "ConfigMap", "-dashboard")
	if got, _, _ := unstructured.NestedString(cm.Object, "data", "vipd-dashboard.json"); strings.TrimSpace(got) != strings.TrimSpace(string(dash)) {
		t.Errorf("dashboard ConfigMap differs from deploy/monitoring/vipd-dashboard.json")
	}
	if cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v lack grafana_dashboard: \"1\"", cm.GetLabels())
	}
	sm := find(t, objs, "ServiceMonitor", "-controllers")
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	svc := find(t, objs, "Service", "-controllers-metrics")
	for k, v := range sel {
		if svc.GetLabels()[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s, the metrics Service has %v", k, v, svc.GetLabels())
		}
	}

	pm := find(t, objs, "PodMonitor", "-node")
	pmSel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	dsLabels, _, _ := unstructured.NestedStringMap(find(t, objs, "DaemonSet", "-node").Object, "spec", "template", "metadata", "labels")
	for k, v := range pmSel {
		if dsLabels[k] != v {
			t.Errorf("PodMonitor selects %s=%s, the DaemonSet's pods have %v", k, v, dsLabels)
		}
	}

	// The node form: the gossip key Secret it mounts, every setting of the values.
	ds := find(t, objs, "DaemonSet", "-node")
	envs := containerEnv(t, ds)
	for k, v := range map[string]string{
		"VIPD_POOLS": "on", "VIPD_EGRESS_POLICIES": "on", "VIPD_MODE": "l2", "VIPD_INTERFACE": "eth0", "VIPD_ADDRESS": "192.0.2.150/32",
		"VIPD_PEERS": "192.0.2.11,192.0.2.12,192.0.2.13", "VIPD_GOSSIP_KEY_FILE": "/etc/vipd/gossip/gossip.key",
		"VIPD_KUBECONFIG": "/etc/vipd/kubeconfig/kubeconfig", "VIPD_PRIORITY": "10",
		"VIPD_EGRESS_CLUSTER_CIDRS": "10.244.0.0/16,10.96.0.0/12",
	} {
		if envs[k] != v {
			t.Errorf("DaemonSet env %s=%v, want %q", k, envs[k], v)
		}
	}
	sec := find(t, objs, "Secret", "-gossip")
	if got, _, _ := unstructured.NestedString(sec.Object, "stringData", "gossip.key"); got == "" {
		t.Errorf("gossip Secret has no gossip.key")
	}
	vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	if !strings.Contains(fmt.Sprint(vols), sec.GetName()) {
		t.Errorf("DaemonSet volumes %v do not mount Secret %s", vols, sec.GetName())
	}
	if hn, _, _ := unstructured.NestedBool(ds.Object, "spec", "template", "spec", "hostNetwork"); !hn {
		t.Errorf("DaemonSet without hostNetwork")
	}
}

// compareContainer checks that the chart's controllers container has
// everything deploy/kube/deployment.yaml's has.
func compareContainer(t *testing.T, shipped, chart *unstructured.Unstructured) {
	t.Helper()
	want, have := containerEnv(t, shipped), containerEnv(t, chart)
	for k, v := range want {
		h, ok := have[k]
		if !ok {
			t.Errorf("chart Deployment lacks env %s", k)
			continue
		}
		if k == "VIPD_CONTROLLERS" {
			continue // the chart's list is the enabled controllers
		}
		if !reflect.DeepEqual(h, v) {
			t.Errorf("chart Deployment env %s=%v, deploy/kube %v", k, h, v)
		}
	}
	if got := have["VIPD_CONTROLLERS"]; got != "floatingippool,nodednsrecordset,services,ipam" {
		t.Errorf("VIPD_CONTROLLERS=%v with every controller on", got)
	}
	pod := func(o *unstructured.Unstructured, f ...string) any {
		v, _, _ := unstructured.NestedFieldNoCopy(o.Object, append([]string{"spec", "template", "spec"}, f...)...)
		return v
	}
	ctr := func(o *unstructured.Unstructured) map[string]any {
		cs := pod(o, "containers").([]any)
		return cs[0].(map[string]any)
	}
	for _, f := range [][]string{{"securityContext"}, {"volumes"}} {
		if !reflect.DeepEqual(pod(chart, f...), pod(shipped, f...)) {
			t.Errorf("pod %v: chart %v, deploy/kube %v", f, pod(chart, f...), pod(shipped, f...))
		}
	}
	for _, f := range []string{"args", "ports", "livenessProbe", "resources", "securityContext", "volumeMounts", "imagePullPolicy", "name"} {
		if !reflect.DeepEqual(ctr(chart)[f], ctr(shipped)[f]) {
			t.Errorf("container %s: chart %v, deploy/kube %v", f, ctr(chart)[f], ctr(shipped)[f])
		}
	}
	r, _, _ := unstructured.NestedFieldNoCopy(chart.Object, "spec", "replicas")
	w, _, _ := unstructured.NestedFieldNoCopy(shipped.Object, "spec", "replicas")
	if fmt.Sprint(r) != fmt.Sprint(w) {
		t.Errorf("replicas %v, deploy/kube %v", r, w)
	}
}

func glob(t testing.TB, root, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(root, pattern))
	if err != nil || len(m) == 0 {
		t.Fatalf("glob %s: %v %v", pattern, m, err)
	}
	return m
}

// Least privilege per controller: each controller alone gets its own rules
// and none of the others'.
func TestRBACPerController(t *testing.T) {
	signature := map[string][]rule{
		"floatingippool":   {{"flipop.digitalocean.com", "floatingippools", "update"}, {"", "nodes", "patch"}},
		"nodednsrecordset": {{"flipop.digitalocean.com", "nodednsrecordsets", "update"}},
		"services":         {{"", "services", "update"}, {"", "services/status", "patch"}, {"vipd.io", "ipallocations", "create"}},
		"ipam":             {{"ipam.cluster.x-k8s.io", "ipaddresses", "create"}, {"cluster.x-k8s.io", "clusters", "get"}, {"vipd.io", "ipallocations", "create"}},
	}
	for only := range signature {
		t.Run(only, func(t *testing.T) {
			args := []string{"--set", "controllers.services=false", "--set", "controllers." + only + "=true"}
			if only == "floatingippool" || only == "nodednsrecordset" {
				args = append(args, "--set", "controllers.providerSecret.name=flipop")
			}
			objs := render(t, args...)
			rules := rulesOf(t, find(t, objs, "ClusterRole", "-controllers"))
			for name, sig := range signature {
				for _, r := range sig {
					mine := name == only || (r.group == "vipd.io" && (only == "services" || only == "ipam"))
					if rules[r] != mine {
						t.Errorf("with only %s: grants %v = %v, want %v", only, r, rules[r], mine)
					}
				}
			}
			if d := containerEnv(t, find(t, objs, "Deployment", "-controllers")); d["VIPD_CONTROLLERS"] != only {
				t.Errorf("VIPD_CONTROLLERS=%v, want %s", d["VIPD_CONTROLLERS"], only)
			}
		})
	}
}

// The Makefile builds and fetches the versions the tests look for.
func TestVersionsMatchMakefile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"HELM_VERSION := " + HelmVersion + "\n",
		"KUBE_VERSION := " + kubetest.KubeVersion + "\n",
		"PROMETHEUS_OPERATOR_VERSION := " + PrometheusOperatorVersion + "\n",
	} {
		if !strings.Contains(string(b), line) {
			t.Errorf("the Makefile has no %q", strings.TrimSpace(line))
		}
	}
	sh, err := os.ReadFile(filepath.Join(repoRoot(t), "hack", "k8s-binaries.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for name, version := range map[string]string{"HELM_VERSION": HelmVersion, "KUBE_VERSION": kubetest.KubeVersion} {
		if !strings.Contains(string(sh), name+`="${`+name+`:-`+version+`}"`) {
			t.Errorf("hack/k8s-binaries.sh's default %s is not %s", name, version)
		}
	}
}

// Each part switches off on its own.
func TestTemplateParts(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want map[string]int
	}{
		{"node form only", []string{"--set", "controllers.enabled=false,node.enabled=true"}, map[string]int{
			"CustomResourceDefinition": 5, "ServiceAccount": 1, "ConfigMap": 1, "DaemonSet": 1, "ClusterRole": 1, "ClusterRoleBinding": 1}},
		{"no RBAC, no ServiceAccount", []string{"--set", "rbac.create=false,serviceAccount.create=false,serviceAccount.controllersName=mine"}, map[string]int{
			"CustomResourceDefinition": 5, "Deployment": 1, "Service": 1}},
		{"dashboard only", []string{"--set", "metrics.dashboard.enabled=true,metrics.dashboard.namespace=grafana,metrics.service.enabled=false"}, map[string]int{
			"CustomResourceDefinition": 5, "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 1, "RoleBinding": 1, "Deployment": 1, "ConfigMap": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.args...)
			if got := kinds(objs); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("kinds %v, want %v", got, tc.want)
			}
		})
	}
	objs := render(t, "--set", "rbac.create=false,serviceAccount.create=false,serviceAccount.controllersName=mine")
	if sa, _, _ := unstructured.NestedString(find(t, objs, "Deployment", "-controllers").Object, "spec", "template", "spec", "serviceAccountName"); sa != "mine" {
		t.Errorf("serviceAccountName %q, want mine", sa)
	}
	objs = render(t, "--set", "metrics.dashboard.enabled=true,metrics.dashboard.namespace=grafana")
	if ns := find(t, objs, "ConfigMap", "-dashboard").GetNamespace(); ns != "grafana" {
		t.Errorf("dashboard in namespace %s, want grafana", ns)
	}
}

// TestNodeMemoryLockCapability: the node form adds IPC_LOCK exactly when
// vipd will lock its memory (VIPD_MEMORY_LOCK=on, or VIPD_PROFILE=fast
// without VIPD_MEMORY_LOCK=off): mlockall needs it in a pod, and without
// it the fast profile runs unlocked with a warning.
func TestNodeMemoryLockCapability(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		want bool
	}{
		{"default", "", false},
		{"fast profile", "node.env.VIPD_PROFILE=fast", true},
		{"fast profile, lock off", "node.env.VIPD_PROFILE=fast,node.env.VIPD_MEMORY_LOCK=off", false},
		{"lock on", "node.env.VIPD_MEMORY_LOCK=on", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := "controllers.enabled=false,node.enabled=true"
			if tc.env != "" {
				set += "," + tc.env
			}
			ds := find(t, render(t, "--set", set), "DaemonSet", "")
			cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
			add, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "securityContext", "capabilities", "add")
			if got := slices.Contains(add, "IPC_LOCK"); got != tc.want {
				t.Errorf("capabilities %v: IPC_LOCK %v, want %v", add, got, tc.want)
			}
			if !slices.Contains(add, "NET_ADMIN") || len(add) > 4 {
				t.Errorf("capabilities %v", add)
			}
		})
	}
}
