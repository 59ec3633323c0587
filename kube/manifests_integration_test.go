package kube

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/internal/kubetest"
)

// TestShippedManifestsAreAccepted sends every manifest under deploy/kube to
// the apiserver with a server-side dry run, so schema or field mistakes in
// the Deployment, RBAC or examples fail here.
func TestShippedManifestsAreAccepted(t *testing.T) {
	h := newHarness(t)
	t.Parallel()
	files, err := filepath.Glob(repoPath(t, "deploy/kube/*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	examples, _ := filepath.Glob(repoPath(t, "deploy/kube/examples/*.yaml"))
	files = append(files, examples...)
	if len(files) < 5 {
		t.Fatalf("found only %v", files)
	}
	objs, err := kubetest.ReadObjects(files...)
	if err != nil {
		t.Fatal(err)
	}
	resources := map[string]schema.GroupVersionResource{
		"Namespace":          {Version: "v1", Resource: "namespaces"},
		"ServiceAccount":     {Version: "v1", Resource: "serviceaccounts"},
		"Deployment":         {Group: "apps", Version: "v1", Resource: "deployments"},
		"ClusterRole":        {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
		"ClusterRoleBinding": {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
		"Role":               {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
		"RoleBinding":        {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
		"FloatingIPPool":     FloatingIPPoolResource,
		"NodeDNSRecordSet":   NodeDNSRecordSetResource,
	}
	for _, o := range objs {
		gvr, ok := resources[o.GetKind()]
		if !ok {
			t.Fatalf("no resource known for kind %s", o.GetKind())
		}
		o.SetResourceVersion("")
		var err error
		if ns := o.GetNamespace(); ns != "" {
			_, err = h.dyn.Resource(gvr).Namespace(ns).Create(h.ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		} else {
			_, err = h.dyn.Resource(gvr).Create(h.ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		}
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Errorf("%s %s/%s rejected: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

func TestCreateIPErrorsAndRecovery(t *testing.T) {
	h := newHarness(t)
	t.Parallel()
	h.do.AddFault(fakedo.Fault{Method: "POST", Path: "/v2/reserved_ips", Status: 429, Count: 1})
	h.apply(h.example("floatingippool.yaml", func(spec map[string]any) { spec["desiredIPs"] = int64(1) }))
	h.start("one")
	eventually(t, 15*time.Second, "creation error in status", func() error {
		if e := h.pool("ingress-pool").Status.Error; !strings.HasPrefix(e, "creating new ip with provider: ") {
			return fmt.Errorf("status.error %q", e)
		}
		return nil
	})
	eventually(t, 15*time.Second, "created after the backoff", func() error {
		p := h.pool("ingress-pool")
		if len(p.Spec.IPs) != 1 || p.Status.Error != "" {
			return fmt.Errorf("spec.ips %v, status.error %q", p.Spec.IPs, p.Status.Error)
		}
		if p.Status.IPs[p.Spec.IPs[0]].State != IPStateUnassigned {
			return fmt.Errorf("status %+v", p.Status.IPs)
		}
		return nil
	})
	never(t, 2*time.Second, "exactly one IP created", func() error {
		if n := h.do.Count("POST", "/v2/reserved_ips"); n != 2 { // the 429 and the success
			return fmt.Errorf("%d create calls", n)
		}
		return nil
	})
}
