package kubetest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vipd/vipd/internal/testenv"
)

// ClusterAPIVersion is the Cluster API release whose own IPAM CRDs the tests
// install (fetched into the module cache by `make go-deps`; the Makefile's
// CAPI_VERSION must match).
const ClusterAPIVersion = "v1.10.4"

// ClusterAPICRDs returns the CRD files of Cluster API's IPAddressClaim,
// IPAddress and Cluster (for spec.paused) from the module cache: the tests
// install Cluster API's own definitions, not copies.
func ClusterAPICRDs(t testing.TB) []string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Missing(t, "the go command is needed to find sigs.k8s.io/cluster-api@%s in the module cache", ClusterAPIVersion)
	}
	cmd := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/cluster-api@"+ClusterAPIVersion)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		testenv.Missing(t, "sigs.k8s.io/cluster-api@%s is not in the module cache (make go-deps): %v", ClusterAPIVersion, err)
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		testenv.Missing(t, "go mod download sigs.k8s.io/cluster-api@%s: %v %s", ClusterAPIVersion, err, out)
	}
	files := []string{
		filepath.Join(info.Dir, "config/crd/bases/ipam.cluster.x-k8s.io_ipaddressclaims.yaml"),
		filepath.Join(info.Dir, "config/crd/bases/ipam.cluster.x-k8s.io_ipaddresses.yaml"),
		filepath.Join(info.Dir, "config/crd/bases/cluster.x-k8s.io_clusters.yaml"),
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("Cluster API %s has no %s: %v", ClusterAPIVersion, f, err)
		}
	}
	return files
}
