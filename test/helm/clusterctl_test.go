package helm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
)

const providerVersion = "v0.4.2"

// releaseArtifacts runs what `make release-artifacts` runs into a
// temporary repository and returns the version directory.
func releaseArtifacts(t *testing.T, version string) (string, error) {
	t.Helper()
	out := t.TempDir()
	cmd := exec.Command("go", "run", "./hack/ipam-components", "-helm", helmBinary(t), "-chart", "deploy/helm/vipd",
		"-version", version, "-out", out)
	cmd.Dir = repoRoot(t)
	b, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, b)
	}
	return filepath.Join(out, "ipam-vipd", version), nil
}

// variable is clusterctl's ${VAR} and ${VAR:=default} (drone/envsubst).
var variable = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:=([^}]*))?\}`)

// substitute renders the variables as clusterctl does: a value from vars,
// else the default; a variable with neither is an error.
func substitute(s string, vars map[string]string) (string, error) {
	var missing []string
	out := variable.ReplaceAllStringFunc(s, func(m string) string {
		g := variable.FindStringSubmatch(m)
		if v, ok := vars[g[1]]; ok {
			return v
		}
		if g[2] != "" {
			return g[3]
		}
		missing = append(missing, g[1])
		return ""
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("variables without value or default: %v", missing)
	}
	if strings.Contains(out, "${") {
		return "", fmt.Errorf("a ${...} clusterctl would not understand is left")
	}
	return out, nil
}

// The layout and objects follow clusterctl's provider contract.
func TestClusterctlArtifacts(t *testing.T) {
	dir, err := releaseArtifacts(t, providerVersion)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "metadata.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		APIVersion    string `json:"apiVersion"`
		Kind          string `json:"kind"`
		ReleaseSeries []struct {
			Major, Minor int
			Contract     string
		} `json:"releaseSeries"`
	}
	if err := yaml.UnmarshalStrict(b, &meta); err != nil {
		t.Fatalf("metadata.yaml: %v", err)
	}
	if meta.APIVersion != "clusterctl.cluster.x-k8s.io/v1alpha3" || meta.Kind != "Metadata" ||
		len(meta.ReleaseSeries) != 1 || meta.ReleaseSeries[0].Major != 0 || meta.ReleaseSeries[0].Minor != 4 || meta.ReleaseSeries[0].Contract != "v1beta1" {
		t.Errorf("metadata.yaml: %+v, want the release series 0.4 on contract v1beta1", meta)
	}

	raw, err := os.ReadFile(filepath.Join(dir, "ipam-components.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vars []string
	for _, m := range variable.FindAllStringSubmatch(string(raw), -1) {
		vars = append(vars, m[0])
	}
	sort.Strings(vars)
	if want := []string{"${VIPD_LOG_FORMAT:=json}", "${VIPD_LOG_LEVEL:=info}"}; fmt.Sprint(vars) != fmt.Sprint(want) {
		t.Errorf("variables %v, want %v", vars, want)
	}
	objs, err := decode(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	var namespaces []string
	kindsSeen := map[string]int{}
	for _, o := range objs {
		kindsSeen[o.GetKind()]++
		if o.GetLabels()["cluster.x-k8s.io/provider"] != "ipam-vipd" {
			t.Errorf("%s %s lacks the label cluster.x-k8s.io/provider=ipam-vipd: %v", o.GetKind(), o.GetName(), o.GetLabels())
		}
		if _, helm := o.GetLabels()["helm.sh/chart"]; helm {
			t.Errorf("%s %s keeps Helm's labels", o.GetKind(), o.GetName())
		}
		switch o.GetKind() {
		case "Namespace":
			namespaces = append(namespaces, o.GetName())
		case "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding":
			if o.GetNamespace() != "" {
				t.Errorf("%s %s has a namespace", o.GetKind(), o.GetName())
			}
		default:
			if o.GetNamespace() != "vipd-ipam-system" {
				t.Errorf("%s %s in namespace %q, want the target namespace vipd-ipam-system", o.GetKind(), o.GetName(), o.GetNamespace())
			}
		}
		if o.GetKind() == "CustomResourceDefinition" && o.GetName() != "ippools.vipd.io" && o.GetName() != "ipallocations.vipd.io" {
			t.Errorf("CRD %s is not the IPAM provider's", o.GetName())
		}
	}
	if fmt.Sprint(namespaces) != "[vipd-ipam-system]" {
		t.Errorf("Namespace objects %v, want exactly one (clusterctl's default target namespace)", namespaces)
	}
	if kindsSeen["CustomResourceDefinition"] != 2 || kindsSeen["Deployment"] != 1 || kindsSeen["ClusterRole"] != 1 {
		t.Errorf("objects %v", kindsSeen)
	}
	d := find(t, objs, "Deployment", "-controllers")
	cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if name := cs[0].(map[string]any)["name"]; name != "manager" {
		t.Errorf("container %v, the contract names it manager", name)
	}
	// clusterctl parses the image for its overrides: a plain reference.
	if img := cs[0].(map[string]any)["image"]; img != "ghcr.io/vipd/vipd:0.4.2" {
		t.Errorf("image %v, want ghcr.io/vipd/vipd:0.4.2", img)
	}
	if got := containerEnv(t, d)["VIPD_CONTROLLERS"]; got != "ipam" {
		t.Errorf("VIPD_CONTROLLERS=%v, want ipam", got)
	}
	rules := rulesOf(t, find(t, objs, "ClusterRole", "-controllers"))
	if rules[rule{"", "services", "update"}] || !rules[rule{"ipam.cluster.x-k8s.io", "ipaddresses", "create"}] {
		t.Errorf("the provider's ClusterRole is not the ipam controller's: %v", rules)
	}

	// A version clusterctl cannot place in a repository is refused.
	if _, err := releaseArtifacts(t, "0.0.0~git3.abc"); err == nil || !strings.Contains(err.Error(), "-version") {
		t.Errorf("version 0.0.0~git3.abc: %v, want a -version error", err)
	}
}

// TestClusterctlInstall renders the variables as clusterctl does, applies
// the components to the real apiserver together with Cluster API's CRDs,
// runs the provider's Deployment as rendered under its ServiceAccount and
// serves an IPAddressClaim.
func TestClusterctlInstall(t *testing.T) {
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := releaseArtifacts(t, providerVersion)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "ipam-components.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := substitute(string(raw), map[string]string{}); err != nil {
		t.Fatalf("with no variables set: %v", err)
	}
	rendered, err := substitute(string(raw), map[string]string{"VIPD_LOG_LEVEL": "debug"})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(rendered)
	if err != nil {
		t.Fatal(err)
	}
	d := find(t, objs, "Deployment", "-controllers")
	if env := containerEnv(t, d); env["VIPD_LOG_LEVEL"] != "debug" || env["VIPD_LOG_FORMAT"] != "json" {
		t.Errorf("VIPD_LOG_LEVEL %v (set: debug), VIPD_LOG_FORMAT %v (default: json)", env["VIPD_LOG_LEVEL"], env["VIPD_LOG_FORMAT"])
	}

	serveForeignCRDs(ctx, t, srv)
	if err := kubetest.Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatalf("apply ipam-components.yaml: %v", err)
	}
	kc, dyn := srv.Clients(t)
	sa, _, _ := unstructured.NestedString(d.Object, "spec", "template", "spec", "serviceAccountName")
	waitAccess(ctx, t, kc, "vipd-ipam-system", sa,
		access{"create", "ipam.cluster.x-k8s.io", "ipaddresses", true},
		access{"update", "", "services", false},
	)

	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "vipd.io/v1alpha1", "kind": "IPPool",
		"metadata": map[string]any{"name": "clusterctl-test"},
		"spec": map[string]any{"addresses": []any{"198.18.41.10-198.18.41.20"}, "mode": "l2",
			"gateway": "198.18.41.1", "prefixLength": int64(24), "autoAssign": false},
	}}
	if err := kubetest.Apply(ctx, srv.Config(), pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(ippools).Delete(context.Background(), "clusterctl-test", metav1.DeleteOptions{})
	})

	out := runDeployment(t, srv, d)
	claim := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ipam.cluster.x-k8s.io/v1beta1", "kind": "IPAddressClaim",
		"metadata": map[string]any{"name": "clusterctl-m1", "namespace": "default"},
		"spec":     map[string]any{"poolRef": map[string]any{"apiGroup": "vipd.io", "kind": "IPPool", "name": "clusterctl-test"}},
	}}
	if _, err := dyn.Resource(claims).Namespace("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(claims).Namespace("default").Delete(context.Background(), "clusterctl-m1", metav1.DeleteOptions{})
	})
	testenv.Eventually(ctx, t, 60*time.Second, "the IPAddressClaim gets an IPAddress from the provider", func() error {
		a, err := dyn.Resource(ipaddresses).Namespace("default").Get(ctx, "clusterctl-m1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ip, _, _ := unstructured.NestedString(a.Object, "spec", "address")
		gw, _, _ := unstructured.NestedString(a.Object, "spec", "gateway")
		if !strings.HasPrefix(ip, "198.18.41.") || gw != "198.18.41.1" {
			return fmt.Errorf("IPAddress spec.address %q gateway %q", ip, gw)
		}
		return nil
	})
	if s := out.String(); strings.Contains(s, "forbidden") {
		t.Errorf("the provider hit a permission error:\n%s", s)
	}
}
