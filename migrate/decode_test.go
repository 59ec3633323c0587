package migrate

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"testing"
)

// TestManifestDecodingGolden pins, byte for byte, what both migrators make
// of manifests that stress the YAML decoding: wrong types in the fields
// migrate reads (the error must name the line, the object and the field,
// in the words of the Kubernetes API types), fields it ignores,
// scalars the API types turn into strings, null and empty values, and all
// three workload kinds. The expected output is testdata/decode.golden;
// regenerate with go test ./migrate -run TestManifestDecodingGolden -update
// (then review the diff).
func TestManifestDecodingGolden(t *testing.T) {
	const pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: kube-vip, namespace: kube-system}\nspec:\n"
	const kv = "  containers:\n  - name: kube-vip\n    image: ghcr.io/kube-vip/kube-vip:v0.8.0\n"
	const ne = "  containers:\n  - name: agent\n    image: novaedge:1\n"
	tests := []struct {
		name string
		in   string
	}{
		{"containers not a list", pod + "  containers: 3\n"},
		{"container not a mapping", pod + "  containers: [3]\n"},
		{"container name a list", pod + "  containers:\n  - name: [a]\n"},
		{"image a mapping", pod + "  containers:\n  - name: kube-vip\n    image: {a: b}\n"},
		{"env a string", pod + kv + "    env: x\n"},
		{"env entry a string", pod + kv + "    env: [x]\n"},
		{"env name a list", pod + kv + "    env: [{name: [a], value: b}]\n"},
		{"env value a mapping", pod + kv + "    env: [{name: address, value: {a: b}}]\n"},
		{"env value a list", pod + kv + "    env: [{name: address, value: [a]}]\n"},
		{"valueFrom a string", pod + kv + "    env: [{name: vip_nodename, valueFrom: x}]\n"},
		{"fieldRef a number", pod + kv + "    env: [{name: vip_nodename, valueFrom: {fieldRef: 3}}]\n"},
		{"fieldPath a list", pod + kv + "    env: [{name: vip_nodename, valueFrom: {fieldRef: {fieldPath: [a]}}}]\n"},
		{"secretKeyRef key a list", pod + kv + "    env: [{name: bgp_peers, valueFrom: {secretKeyRef: {name: s, key: [a]}}}]\n"},
		{"configMapKeyRef name a list", pod + kv + "    env: [{name: bgp_peers, valueFrom: {configMapKeyRef: {name: [s], key: k}}}]\n"},
		{"resourceFieldRef resource a list", pod + kv + "    env: [{name: x, valueFrom: {resourceFieldRef: {resource: [a]}}}]\n"},
		{"envFrom a string", pod + kv + "    envFrom: x\n"},
		{"envFrom configMapRef name a list", pod + kv + "    envFrom: [{configMapRef: {name: [a]}}]\n"},
		{"envFrom secretRef a string", pod + kv + "    envFrom: [{secretRef: x}]\n"},
		{"args a string", pod + kv + "    args: manager\n"},
		{"args entry a mapping", pod + kv + "    args: [{a: b}]\n"},
		{"volumeMounts a string", pod + kv + "    volumeMounts: x\n"},
		{"volumeMount name a list", pod + kv + "    volumeMounts: [{name: [a], mountPath: /x}]\n"},
		{"volumes a string", pod + kv + "  volumes: x\n"},
		{"hostPath a string", pod + kv + "  volumes: [{name: a, hostPath: x}]\n"},
		{"hostPath path a list", pod + kv + "  volumes: [{name: a, hostPath: {path: [a]}}]\n"},
		{"spec a list", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: [a]\n"},
		{"metadata name a list", "apiVersion: v1\nkind: Pod\nmetadata: {name: [a]}\nspec:\n" + kv},
		{"metadata namespace a list", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: [a]}\nspec:\n" + kv},
		{"metadata a string", "apiVersion: v1\nkind: Pod\nmetadata: x\nspec:\n" + kv},
		{"kind a list", "apiVersion: v1\nkind: [Pod]\nspec:\n" + kv},
		{"apiVersion a list", "apiVersion: [v1]\nkind: Pod\nspec:\n" + kv},
		{"daemonset spec a string", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: d}\nspec: x\n"},
		{"daemonset template a string", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: d}\nspec: {template: x}\n"},
		{"daemonset template spec a string", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: d}\nspec: {template: {spec: x}}\n"},
		{"daemonset containers a number", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: d}\nspec: {template: {spec: {containers: 1}}}\n"},
		{"deployment template spec a string", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: n}\nspec: {template: {spec: x}}\n"},
		{"deployment containers env a string", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {template: {spec: {containers: [{name: kube-vip, env: x}]}}}\n"},
		{"unquoted scalars", pod + kv + "    args: [manager, --port, 6443, --arp, true]\n    env:\n    - {name: vip_arp, value: true}\n    - {name: address, value: 10.0.0.5}\n    - {name: port, value: 6443}\n    - {name: vip_leaseduration, value: 1.5e1}\n    - {name: vip_interface, value: null}\n    - {name: cp_enable, value: yes}\n"},
		{"null fields", pod + "  volumes: null\n  containers:\n  - name: kube-vip\n    image: null\n    args: null\n    env:\n    - name: address\n      value: 10.0.0.5\n    - null\n    - {name: vip_arp, value: \"true\", valueFrom: null}\n"},
		{"valueFrom kinds", pod + kv + "    env:\n    - {name: address, value: 10.0.0.5}\n    - {name: vip_arp, value: \"true\"}\n    - {name: vip_nodename, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}\n    - {name: bgp_peers, valueFrom: {secretKeyRef: {name: peers, key: list}}}\n    - {name: vip_interface, valueFrom: {configMapKeyRef: {name: net, key: if}}}\n    - {name: vip_leaseduration, valueFrom: {resourceFieldRef: {resource: limits.cpu}}}\n    - {name: vip_renewdeadline, valueFrom: {}}\n    envFrom:\n    - configMapRef: {name: kv-config}\n    - secretRef: {name: kv-secret}\n    - prefix: X_\n    volumeMounts:\n    - {name: kubeconfig, mountPath: /etc/kubernetes/admin.conf}\n    - {name: other, mountPath: /other}\n  volumes:\n  - {name: kubeconfig, hostPath: {path: /etc/kubernetes/super-admin.conf, type: FileOrCreate}}\n  - {name: other, emptyDir: {}}\n  - {name: unmounted, hostPath: {path: /unmounted}}\n"},
		{"all kinds", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: sa}\n---\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: dep, namespace: ns}\nspec:\n  replicas: 1\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers:\n      - name: kube-vip\n        image: ghcr.io/kube-vip/kube-vip:v0.8.0\n        env: [{name: address, value: 10.0.0.9}, {name: vip_arp, value: \"true\"}]\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: ds}\nspec:\n  template:\n    spec:\n      containers:\n      - name: kube-vip\n        env: [{name: address, value: 10.0.0.8}, {name: vip_arp, value: \"true\"}]\n        args: [manager]\n"},
		{"novaedge args and env", pod + ne + "    args: [--control-plane-vip, --cp-vip-address=10.0.0.7/32, 7]\n    env: [{name: NOVAEDGE_CP_VIP_INTERFACE, value: eth1}, {name: NOVAEDGE_CP_VIP_MODE, valueFrom: {configMapKeyRef: {name: m, key: k}}}]\n"},
		// Fields migrate does not read are not validated: wrong types
		// there are ignored (kubectl would have refused the manifest).
		{"fieldRef apiVersion a list", pod + kv + "    env: [{name: vip_nodename, valueFrom: {fieldRef: {apiVersion: [a], fieldPath: spec.nodeName}}}]\n"},
		{"secretKeyRef optional a string", pod + kv + "    env: [{name: bgp_peers, valueFrom: {secretKeyRef: {name: s, key: k, optional: maybe}}}]\n"},
		{"command a string", pod + kv + "    command: /kube-vip\n"},
		{"volumeMount readOnly a string", pod + kv + "    volumeMounts: [{name: a, mountPath: /x, readOnly: maybe}]\n"},
		{"hostPath type a list", pod + kv + "  volumes: [{name: a, hostPath: {path: /a, type: [a]}}]\n"},
		{"resources quantity invalid", pod + kv + "    env: [{name: address, value: 10.0.0.5}]\n    resources: {limits: {cpu: lots}}\n"},
		{"labels value a list", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: {a: [1]}}\nspec:\n" + kv + "    env: [{name: address, value: 10.0.0.5}]\n"},
		{"creationTimestamp invalid", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, creationTimestamp: yesterday}\nspec:\n" + kv + "    env: [{name: address, value: 10.0.0.5}]\n"},
		{"containerPort a name", pod + kv + "    env: [{name: address, value: 10.0.0.5}]\n    ports: [{containerPort: http}]\n"},
		{"hostNetwork a string", pod + "  hostNetwork: maybe\n" + kv + "    env: [{name: address, value: 10.0.0.5}]\n"},
		{"replicas a string", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: many, template: {spec: {containers: [{name: kube-vip, env: [{name: address, value: 10.0.0.5}]}]}}}\n"},
		{"novaedge env value a list", pod + ne + "    env: [{name: NOVAEDGE_CP_VIP_ADDRESS, value: [a]}]\n"},
	}
	var out bytes.Buffer
	for _, tc := range tests {
		for _, m := range []struct {
			tool string
			fn   func(io.Reader) (Result, error)
		}{{"kubevip", KubeVIP}, {"novaedge", NovaEdge}} {
			fmt.Fprintf(&out, "=== %s: %s\n", m.tool, tc.name)
			res, err := m.fn(bytes.NewReader([]byte(tc.in)))
			if err != nil {
				fmt.Fprintf(&out, "error: %v\n", err)
				continue
			}
			if err := res.WriteEnv(&out); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(&out, "--- warnings")
			if err := res.WriteWarnings(&out); err != nil {
				t.Fatal(err)
			}
		}
	}
	compareGolden(t, filepath.Join("testdata", "decode.golden"), out.Bytes())
}
