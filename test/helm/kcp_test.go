package helm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/kubetest"
)

var kcps = schema.GroupVersionResource{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta1", Resource: "kubeadmcontrolplanes"}

// TestKubeadmControlPlaneAccepted generates a KubeadmControlPlane with
// `vipd manifest kubeadm-control-plane` and creates it against Cluster API's
// own KubeadmControlPlane CRD (from the module cache at CAPI_VERSION) with
// strict field validation: nothing is unknown, nothing is pruned. The env
// file it writes on the machines passes `vipd check-config`.
func TestKubeadmControlPlaneAccepted(t *testing.T) {
	srv := env.Require(t)
	bin := vipdBuild.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	capi := moduleDir(t, "sigs.k8s.io/cluster-api@"+kubetest.ClusterAPIVersion)
	objs, err := kubetest.ReadObjects(filepath.Join(capi, "controlplane/kubeadm/config/crd/bases/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"l2 deb", []string{"--cluster-name", "c1", "--address", "192.0.2.100/32,2001:db8::100/128",
			"--peers", "192.0.2.11,192.0.2.12,192.0.2.13", "--gossip-key-secret", "c1-vipd-gossip",
			"--package-url", "https://example.com/vipd_1.2.3-1_amd64.deb", "--package-sha256", strings.Repeat("0f", 32)}},
		{"bgp rpm", []string{"--cluster-name", "c2", "--replicas", "5", "--address", "192.0.2.200/32", "--mode", "bgp",
			"--bgp-local-as", "65001", "--bgp-peers", "192.0.2.1:65000", "--bfd-enabled", "true",
			"--package-url", "https://example.com/vipd-1.2.3-1.x86_64.rpm"}},
		{"image", []string{"--cluster-name", "c3", "--replicas", "1", "--address", "2001:db8::300/128"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"manifest", "kubeadm-control-plane", "--kubernetes-version", "v1.34.4",
				"--infrastructure-api-version", "infrastructure.cluster.x-k8s.io/v1beta1",
				"--infrastructure-kind", "Metal3MachineTemplate", "--infrastructure-name", "cp"}, tc.args...)
			cmd := exec.CommandContext(ctx, bin, args...)
			cmd.Env = baseEnvWithout()
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("vipd %v: %v", args, err)
			}
			docs, err := decode(string(out))
			if err != nil || len(docs) != 1 {
				t.Fatalf("decode: %v (%d objects)\n%s", err, len(docs), out)
			}
			kcp := docs[0]
			created, err := dyn.Resource(kcps).Namespace(kcp.GetNamespace()).Create(ctx, kcp,
				metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
			if err != nil {
				t.Fatalf("KubeadmControlPlane rejected by Cluster API's CRD: %v\n%s", err, out)
			}
			t.Cleanup(func() {
				_ = dyn.Resource(kcps).Namespace(kcp.GetNamespace()).Delete(context.Background(), kcp.GetName(), metav1.DeleteOptions{})
			})
			// Nothing pruned: every field sent is stored as sent.
			sent, _, _ := unstructured.NestedMap(kcp.Object, "spec", "kubeadmConfigSpec")
			stored, _, _ := unstructured.NestedMap(created.Object, "spec", "kubeadmConfigSpec")
			for k, v := range sent {
				if !reflect.DeepEqual(stored[k], v) {
					t.Errorf("spec.kubeadmConfigSpec.%s stored as %v, sent %v", k, stored[k], v)
				}
			}

			// The env file the machines get is one vipd accepts.
			files, _, _ := unstructured.NestedSlice(created.Object, "spec", "kubeadmConfigSpec", "files")
			content := files[0].(map[string]any)["content"].(string)
			dir := t.TempDir()
			envPath := filepath.Join(dir, "vipd.env")
			if err := os.WriteFile(envPath, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			check := []string{"check-config", "--env-file", envPath}
			parsed, err := config.ParseEnvFile([]byte(content))
			if err != nil {
				t.Fatal(err)
			}
			if parsed.Map()["VIPD_GOSSIP_KEY_FILE"] != "" {
				// The Secret's key, as Cluster API writes it.
				key := filepath.Join(dir, "gossip.key")
				if b, err := exec.Command(bin, "keygen", "--out", key).CombinedOutput(); err != nil {
					t.Fatalf("vipd keygen: %v\n%s", err, b)
				}
				check = append(check, "--gossip-key-file", key)
			}
			cc := exec.CommandContext(ctx, bin, check...)
			cc.Env = baseEnvWithout()
			if b, err := cc.CombinedOutput(); err != nil {
				t.Errorf("vipd check-config on the machines' env file: %v\n%s\n%s", err, b, content)
			}
		})
	}
}

// baseEnvWithout is this process's environment without vipd's settings.
func baseEnvWithout() []string {
	var out []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "VIPD_") {
			out = append(out, kv)
		}
	}
	return out
}
