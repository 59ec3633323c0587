package manifest

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/vipd/vipd/config"
)

var kcpBase = []string{"kubeadm-control-plane",
	"--cluster-name", "c1", "--kubernetes-version", "v1.34.4",
	"--infrastructure-api-version", "infrastructure.cluster.x-k8s.io/v1beta1",
	"--infrastructure-kind", "Metal3MachineTemplate", "--infrastructure-name", "c1-cp",
}

func kcpRun(t *testing.T, args ...string) (map[string]any, string, error) {
	t.Helper()
	out, err := run(t, append(append([]string{}, kcpBase...), args...)...)
	if err != nil {
		return nil, out, err
	}
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(out), &obj); err != nil {
		t.Fatalf("output is not YAML: %v\n%s", err, out)
	}
	return obj, out, nil
}

func dig(t *testing.T, m any, path ...string) any {
	t.Helper()
	for _, p := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			t.Fatalf("%v: not an object at %s", path, p)
		}
		m = mm[p]
	}
	return m
}

func TestKubeadmControlPlane(t *testing.T) {
	obj, out, err := kcpRun(t, "--address", "192.0.2.100/32,2001:db8::100/128", "--peers", "192.0.2.11,192.0.2.12,192.0.2.13",
		"--gossip-key-secret", "c1-vipd-gossip", "--package-url", "https://example.com/vipd_1.2.3-1_amd64.deb",
		"--package-sha256", strings.Repeat("ab", 32), "--health-interval", "200ms")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if obj["kind"] != "KubeadmControlPlane" || obj["apiVersion"] != "controlplane.cluster.x-k8s.io/v1beta1" {
		t.Errorf("kind %v %v", obj["apiVersion"], obj["kind"])
	}
	if n := dig(t, obj, "metadata", "name"); n != "c1-control-plane" {
		t.Errorf("name %v", n)
	}
	spec := dig(t, obj, "spec", "kubeadmConfigSpec")
	if ep := dig(t, spec, "clusterConfiguration", "controlPlaneEndpoint"); ep != "192.0.2.100:6443" {
		t.Errorf("controlPlaneEndpoint %v, want the IPv4 VIP", ep)
	}
	if sans := dig(t, spec, "clusterConfiguration", "apiServer", "certSANs"); len(sans.([]any)) != 2 {
		t.Errorf("certSANs %v, want both VIPs", sans)
	}
	files := dig(t, spec, "files").([]any)
	if len(files) != 2 {
		t.Fatalf("files %v", files)
	}
	envFile := files[0].(map[string]any)
	if envFile["path"] != "/etc/vipd/vipd.env" || envFile["permissions"] != "0640" {
		t.Errorf("env file %v", envFile)
	}
	parsed, err := config.ParseEnvFile([]byte(envFile["content"].(string)))
	if err != nil {
		t.Fatalf("the env file does not parse: %v", err)
	}
	want := map[string]string{
		"VIPD_ADDRESS": "192.0.2.100/32,2001:db8::100/128", "VIPD_PEERS": "192.0.2.11,192.0.2.12,192.0.2.13",
		"VIPD_GOSSIP_KEY_FILE": "/etc/vipd/gossip.key", "VIPD_HEALTH_INTERVAL": "200ms",
	}
	got := parsed.Map()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("env file %s=%q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("env file %v, want only %v", got, want)
	}
	key := files[1].(map[string]any)
	if key["path"] != "/etc/vipd/gossip.key" || key["permissions"] != "0600" ||
		dig(t, key, "contentFrom", "secret", "name") != "c1-vipd-gossip" || dig(t, key, "contentFrom", "secret", "key") != "gossip.key" {
		t.Errorf("gossip key file %v", key)
	}
	cmds := dig(t, spec, "preKubeadmCommands").([]any)
	joined := ""
	for _, c := range cmds {
		joined += c.(string) + "\n"
	}
	for _, w := range []string{"curl -fsSL", "'https://example.com/vipd_1.2.3-1_amd64.deb'", "sha256sum -c", "apt-get install -y -o Dpkg::Options::=--force-confold",
		"vipd check-config --env-file /etc/vipd/vipd.env", "systemctl restart vipd"} {
		if !strings.Contains(joined, w) {
			t.Errorf("preKubeadmCommands lack %q:\n%s", w, joined)
		}
	}
	if i, j := strings.Index(joined, "apt-get"), strings.Index(joined, "systemctl restart"); i > j {
		t.Errorf("vipd started before it is installed:\n%s", joined)
	}
	if r := dig(t, obj, "spec", "replicas"); r != float64(3) {
		t.Errorf("replicas %v", r)
	}
}

func TestKubeadmControlPlaneVariants(t *testing.T) {
	// An rpm, IPv6 only, vipd in the image.
	obj, out, err := kcpRun(t, "--address", "2001:db8::100/128", "--package-url", "https://example.com/vipd-1.2.3-1.x86_64.rpm")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if ep := dig(t, obj, "spec", "kubeadmConfigSpec", "clusterConfiguration", "controlPlaneEndpoint"); ep != "[2001:db8::100]:6443" {
		t.Errorf("IPv6 endpoint %v", ep)
	}
	if !strings.Contains(out, "dnf install -y /var/tmp/vipd-package.rpm") {
		t.Errorf("rpm not installed with dnf:\n%s", out)
	}
	if files := dig(t, obj, "spec", "kubeadmConfigSpec", "files").([]any); len(files) != 1 {
		t.Errorf("files without a gossip key Secret: %v", files)
	}
	// A gossip key path of one's own: the Secret is written there.
	obj, out, err = kcpRun(t, "--address", "192.0.2.100/32", "--peers", "192.0.2.11", "--gossip-key-secret", "k", "--gossip-key-file", "/etc/vipd/keys/gossip")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	files := dig(t, obj, "spec", "kubeadmConfigSpec", "files").([]any)
	if p := files[1].(map[string]any)["path"]; p != "/etc/vipd/keys/gossip" || !strings.Contains(out, "VIPD_GOSSIP_KEY_FILE=/etc/vipd/keys/gossip\n") {
		t.Errorf("gossip key written to %v:\n%s", p, out)
	}
	// vipd in the machine image: nothing to install.
	obj, out, err = kcpRun(t, "--address", "192.0.2.100/32")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.Contains(out, "curl") || strings.Contains(out, "apt-get") {
		t.Errorf("installs a package without --package-url:\n%s", out)
	}
	cmds := dig(t, obj, "spec", "kubeadmConfigSpec", "preKubeadmCommands").([]any)
	if len(cmds) != 3 || cmds[2] != "systemctl restart vipd" {
		t.Errorf("vipd in the image: preKubeadmCommands %v, want check-config, enable, restart", cmds)
	}
}

// Bad input: one line naming the flag or setting, the value (never a
// secret's) and the accepted form; nothing printed.
func TestKubeadmControlPlaneRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no VIP", nil, "VIPD_ADDRESS"},
		{"even replicas", []string{"--address", "192.0.2.100/32", "--replicas", "2"}, `--replicas="2"`},
		{"kubernetes version", []string{"--address", "192.0.2.100/32", "--kubernetes-version", "1.34"}, `--kubernetes-version="1.34"`},
		{"peers without key", []string{"--address", "192.0.2.100/32", "--peers", "192.0.2.11", "--gossip-key-file", "/etc/vipd/k"}, "--gossip-key-secret"},
		{"bad package", []string{"--address", "192.0.2.100/32", "--package-url", "https://example.com/vipd.tar.gz"}, `--package-url="https://example.com/vipd.tar.gz"`},
		{"checksum", []string{"--address", "192.0.2.100/32", "--package-url", "https://e.com/v.deb", "--package-sha256", "xyz"}, "--package-sha256"},
		{"bad setting", []string{"--address", "192.0.2.100/32", "--mode", "vrrp"}, "VIPD_MODE"},
		{"node name", []string{"--address", "192.0.2.100/32", "--node-name", "cp-1"}, "VIPD_NODE_NAME"},
		{"cluster name", []string{"--address", "192.0.2.100/32", "--cluster-name", "C_1"}, `--cluster-name="C_1"`},
		{"no machine template", []string{"--address", "192.0.2.100/32", "--infrastructure-kind", ""}, "--infrastructure-kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, out, err := kcpRun(t, tc.args...)
			if err == nil {
				t.Fatalf("accepted %v:\n%s", tc.args, out)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line naming %s", err, tc.want)
			}
			if strings.Contains(out, "kind: KubeadmControlPlane") {
				t.Errorf("printed a manifest:\n%s", out)
			}
		})
	}
	// A token would be readable by everyone who reads the object.
	_, _, err := kcpRun(t, "--address", "192.0.2.100/32", "--mode", "cloud", "--do-token", "dop_v1_secret")
	if err == nil || strings.Contains(err.Error(), "dop_v1_secret") || !strings.Contains(err.Error(), "DIGITALOCEAN_ACCESS_TOKEN") {
		t.Errorf("a token as a setting: %v", err)
	}
}
