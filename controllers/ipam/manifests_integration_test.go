package ipam

import (
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
	"github.com/vipd/vipd/internal/kubetest"
)

// The IPPools vipd ships or generates (deploy/kube/examples/ippool.yaml,
// `vipd migrate metallb` golden outputs) are accepted by the apiserver's
// CRD validation and are valid pools for the allocator.
func TestShippedAndMigratedPoolsAreValid(t *testing.T) {
	h := newHarness(t, false)
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "migrate/testdata/metallb/*.golden.yaml"))
	files = append(files, filepath.Join(root, "deploy/kube/examples/ippool.yaml"))
	if len(files) < 4 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		objs, err := kubetest.ReadObjects(f)
		if err != nil {
			t.Fatal(err)
		}
		var specs []v1alpha1.IPPool
		for _, o := range objs {
			if o.GetKind() != "IPPool" {
				t.Errorf("%s: kind %s", f, o.GetKind())
				continue
			}
			got, err := h.dyn.Resource(v1alpha1.IPPoolResource).Create(h.ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err != nil {
				t.Errorf("%s: IPPool %s rejected: %v", filepath.Base(f), o.GetName(), err)
				continue
			}
			var p v1alpha1.IPPool
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &p); err != nil {
				t.Fatal(err)
			}
			specs = append(specs, p)
		}
		for _, p := range BuildPools(specs) {
			if p.Err != nil {
				t.Errorf("%s: IPPool %s is invalid for the allocator: %v", filepath.Base(f), p.Name, p.Err)
			}
		}
	}
}
