// Command ipam-components writes vipd's Cluster API IPAM provider as a
// clusterctl local repository: <out>/ipam-vipd/<version>/ipam-components.yaml
// and metadata.yaml, following clusterctl's provider contract. The
// components are the Helm chart (deploy/helm/vipd) rendered with only the
// ipam controller, so the two cannot drift apart:
//
//   - one Namespace (vipd-ipam-system), every namespaced object in it;
//   - the IPPool and IPAllocation CRDs, the ClusterRole of the ipam
//     controller, the leader-election Role, the Deployment (container
//     "manager") and its metrics Service;
//   - every object labelled cluster.x-k8s.io/provider=ipam-vipd, Helm's
//     own labels removed;
//   - the image ghcr.io/vipd/vipd:<tag> as a plain reference (clusterctl
//     parses it for its image overrides, so it cannot be a variable);
//   - variables ${VIPD_LOG_LEVEL:=info} and ${VIPD_LOG_FORMAT:=json}.
//
// `make release-artifacts` runs it; test/helm applies its output.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	// ProviderLabel is clusterctl's name for an IPAM provider called vipd.
	ProviderLabel = "ipam-vipd"
	namespace     = "vipd-ipam-system"
	// contract is the Cluster API contract the provider implements
	// (IPAddressClaim/IPAddress ipam.cluster.x-k8s.io/v1beta1).
	contract = "v1beta1"
)

var semver = regexp.MustCompile(`^v(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?$`)

func main() {
	helm := flag.String("helm", "", "the helm binary (make helm: hack/k8s-binaries.sh)")
	chart := flag.String("chart", "deploy/helm/vipd", "the chart directory")
	version := flag.String("version", "", "the provider version, vX.Y.Z (the image tag is X.Y.Z)")
	out := flag.String("out", "out/clusterctl", "the local repository to write into")
	flag.Parse()
	if err := run(*helm, *chart, *version, *out); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-components:", err)
		os.Exit(1)
	}
}

func run(helm, chart, version, out string) error {
	m := semver.FindStringSubmatch(version)
	if m == nil {
		return fmt.Errorf("-version %q: want a semantic version vX.Y.Z (clusterctl's repository layout needs one)", version)
	}
	if helm == "" {
		return errors.New("-helm: the path of the helm binary is required (make helm)")
	}
	cmd := exec.Command(helm, "template", ProviderLabel, chart, "--namespace", namespace, "--include-crds",
		"--set", "controllers.services=false", "--set", "controllers.ipam=true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	rendered, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("helm template: %w: %s", err, stderr.String())
	}
	comps, err := Components(rendered, strings.TrimPrefix(version, "v"))
	if err != nil {
		return err
	}
	dir := filepath.Join(out, ProviderLabel, version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ipam-components.yaml"), comps, 0o644); err != nil {
		return err
	}
	meta := fmt.Sprintf(`# clusterctl metadata of vipd's IPAM provider: release series -> Cluster API contract.
apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3
kind: Metadata
releaseSeries:
  - major: %s
    minor: %s
    contract: %s
`, m[1], m[2], contract)
	if err := os.WriteFile(filepath.Join(dir, "metadata.yaml"), []byte(meta), 0o644); err != nil {
		return err
	}
	fmt.Println(dir)
	return nil
}

// Components turns the chart's output into clusterctl components.
func Components(rendered []byte, tag string) ([]byte, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(rendered), 4096)
	objs := []*unstructured.Unstructured{{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace},
	}}}
	for {
		var o map[string]any
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("decode helm output: %w", err)
		}
		if len(o) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: o}
		if u.GetKind() == "CustomResourceDefinition" && u.GetName() != "ippools.vipd.io" && u.GetName() != "ipallocations.vipd.io" {
			continue // FLIPOP's and EgressPolicy: not the IPAM provider's
		}
		if u.GetKind() == "Deployment" {
			if err := deployment(u, tag); err != nil {
				return nil, err
			}
		}
		objs = append(objs, u)
	}
	var b bytes.Buffer
	b.WriteString("# vipd's Cluster API IPAM provider (clusterctl init --ipam vipd), generated from\n" +
		"# deploy/helm/vipd by `make release-artifacts`. Variables: VIPD_LOG_LEVEL, VIPD_LOG_FORMAT;\n" +
		"# another registry: clusterctl's images: override (ipam-vipd).\n")
	for _, u := range objs {
		labels := u.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		delete(labels, "helm.sh/chart")
		delete(labels, "app.kubernetes.io/managed-by")
		labels["cluster.x-k8s.io/provider"] = ProviderLabel
		u.SetLabels(labels)
		y, err := yaml.Marshal(u.Object)
		if err != nil {
			return nil, err
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.Bytes(), nil
}

// deployment names the container "manager" (the contract's name) and puts
// the variables in.
func deployment(u *unstructured.Unstructured, tag string) error {
	cs, _, err := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
	if err != nil || len(cs) != 1 {
		return fmt.Errorf("deployment %s: want one container (%v)", u.GetName(), err)
	}
	c := cs[0].(map[string]any)
	c["name"] = "manager"
	repo, _, _ := strings.Cut(c["image"].(string), ":")
	c["image"] = repo + ":" + tag
	vars := map[string]string{"VIPD_LOG_LEVEL": "${VIPD_LOG_LEVEL:=info}", "VIPD_LOG_FORMAT": "${VIPD_LOG_FORMAT:=json}"}
	for _, e := range c["env"].([]any) {
		m := e.(map[string]any)
		if v, ok := vars[m["name"].(string)]; ok {
			m["value"] = v
			delete(vars, m["name"].(string))
		}
	}
	if len(vars) > 0 {
		return fmt.Errorf("deployment %s: the chart no longer sets %v", u.GetName(), vars)
	}
	if err := unstructured.SetNestedSlice(u.Object, cs, "spec", "template", "spec", "containers"); err != nil {
		return err
	}
	tl, _, _ := unstructured.NestedStringMap(u.Object, "spec", "template", "metadata", "labels")
	tl["cluster.x-k8s.io/provider"] = ProviderLabel
	return unstructured.SetNestedStringMap(u.Object, tl, "spec", "template", "metadata", "labels")
}
