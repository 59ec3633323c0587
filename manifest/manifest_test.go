package manifest

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/vipd/vipd/config"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite packaging/vipd.env from the settings table")

// flagsOnly is a SettingsFlags for tests: one flag per setting, no
// environment.
func flagsOnly(fs *pflag.FlagSet) config.Source {
	for _, s := range config.Settings() {
		fs.String(s.Flag, "", s.Doc)
	}
	return func(s *config.Setting) (string, bool) {
		f := fs.Lookup(s.Flag)
		if f == nil || !f.Changed {
			return "", false
		}
		return f.Value.String(), true
	}
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := Command("1.2.3", flagsOnly)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func decodePod(t *testing.T, out string) corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(out), &p); err != nil {
		t.Fatalf("manifest does not decode strictly into a v1.Pod: %v\n%s", err, out)
	}
	return p
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

func TestStaticPodL2(t *testing.T) {
	out, err := run(t, "static-pod", "--address", "10.0.0.100/32,fd00::100/128", "--interface", "eth0", "--peers", "10.0.0.11,10.0.0.12",
		"--health-ca-file", "/etc/kubernetes/pki/ca.crt", "--gossip-key-file", "/etc/vipd/gossip.key")
	if err != nil {
		t.Fatal(err)
	}
	p := decodePod(t, out)
	if p.Kind != "Pod" || p.APIVersion != "v1" || p.Name != "vipd" || p.Namespace != "kube-system" {
		t.Errorf("type/meta = %s %s %s/%s", p.APIVersion, p.Kind, p.Namespace, p.Name)
	}
	if !p.Spec.HostNetwork {
		t.Error("hostNetwork is false")
	}
	if len(p.Spec.Containers) != 1 {
		t.Fatalf("%d containers", len(p.Spec.Containers))
	}
	c := p.Spec.Containers[0]
	if c.Image != "ghcr.io/vipd/vipd:1.2.3" {
		t.Errorf("image %q", c.Image)
	}
	if strings.Join(c.Args, " ") != "run" {
		t.Errorf("args %q", c.Args)
	}
	env := envOf(c)
	for name, want := range map[string]string{"VIPD_ADDRESS": "10.0.0.100/32,fd00::100/128", "VIPD_INTERFACE": "eth0", "VIPD_PEERS": "10.0.0.11,10.0.0.12"} {
		if env[name].Value != want {
			t.Errorf("%s = %q, want %q", name, env[name].Value, want)
		}
	}
	if _, ok := env["VIPD_MODE"]; ok {
		t.Error("VIPD_MODE was not given but is in the env")
	}
	nn := env["VIPD_NODE_NAME"]
	if nn.ValueFrom == nil || nn.ValueFrom.FieldRef == nil || nn.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("VIPD_NODE_NAME = %+v, want fieldRef spec.nodeName", nn)
	}
	caps := c.SecurityContext.Capabilities
	if got := capsString(caps.Add); got != "NET_ADMIN,NET_RAW,NET_BIND_SERVICE" {
		t.Errorf("added caps %s", got)
	}
	if capsString(caps.Drop) != "ALL" {
		t.Errorf("dropped caps %s", capsString(caps.Drop))
	}
	if c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
		t.Error("privileged")
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	hostPaths := map[string]string{}
	for _, v := range p.Spec.Volumes {
		if v.HostPath == nil {
			t.Fatalf("volume %s is not a hostPath", v.Name)
		}
		hostPaths[v.Name] = v.HostPath.Path
	}
	for _, path := range []string{"/var/lib/vipd", "/etc/kubernetes/pki/ca.crt"} {
		if hostPaths[mounts[path]] != path {
			t.Errorf("%s not mounted from the host (mounts %v, volumes %v)", path, mounts, hostPaths)
		}
	}
}

func capsString(cs []corev1.Capability) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = string(c)
	}
	return strings.Join(s, ",")
}

func TestStaticPodOptions(t *testing.T) {
	out, err := run(t, "static-pod", "--address", "192.0.2.10/32", "--mode", "bgp", "--bgp-local-as", "65010", "--bgp-peers", "192.0.2.1:65000",
		"--state-dir", "/srv/vipd", "--node-name", "cp-7", "--image", "registry.local/vipd:test", "--pod-name", "vip", "--pod-namespace", "infra")
	if err != nil {
		t.Fatal(err)
	}
	p := decodePod(t, out)
	c := p.Spec.Containers[0]
	if c.Image != "registry.local/vipd:test" || p.Name != "vip" || p.Namespace != "infra" {
		t.Errorf("image %q name %s/%s", c.Image, p.Namespace, p.Name)
	}
	env := envOf(c)
	if env["VIPD_NODE_NAME"].Value != "cp-7" || env["VIPD_NODE_NAME"].ValueFrom != nil {
		t.Errorf("VIPD_NODE_NAME = %+v", env["VIPD_NODE_NAME"])
	}
	if env["VIPD_STATE_DIR"].Value != "/srv/vipd" || c.VolumeMounts[0].MountPath != "/srv/vipd" || p.Spec.Volumes[0].HostPath.Path != "/srv/vipd" {
		t.Errorf("state dir not carried: env %+v mounts %+v", env["VIPD_STATE_DIR"], c.VolumeMounts)
	}
}

func TestStaticPodRefusesBadInput(t *testing.T) {
	_, err := run(t, "static-pod", "--address", "10.0.0.100/24")
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Name != "VIPD_ADDRESS" {
		t.Errorf("err = %v, want a config.Error naming VIPD_ADDRESS", err)
	}
	_, err = run(t, "static-pod")
	if !errors.As(err, &ce) || ce.Name != "VIPD_ADDRESS" {
		t.Errorf("no address: err = %v, want a config.Error naming VIPD_ADDRESS", err)
	}
	_, err = run(t, "static-pod", "--address", "192.0.2.10/32", "--mode", "cloud", "--do-token", "abc")
	if err == nil || !strings.Contains(err.Error(), "DIGITALOCEAN_ACCESS_TOKEN") || !strings.Contains(err.Error(), "mirror Pod") {
		t.Errorf("secret token: err = %v", err)
	}
}

func TestEnvCommand(t *testing.T) {
	out, err := run(t, "env", "--address", "10.0.0.100/32", "--health-interval", "200ms")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nVIPD_ADDRESS=10.0.0.100/32\n", "\nVIPD_HEALTH_INTERVAL=200ms\n", "\n#VIPD_MODE=l2\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("env output lacks %q", want)
		}
	}
	if _, err := run(t, "env", "--health-interval", "forever"); err == nil {
		t.Error("an invalid value was accepted")
	}
}

// TestDefaultEnvFileIsGenerated keeps packaging/vipd.env (the conffile the
// packages install) equal to what the settings table generates. Regenerate
// with: go test ./manifest -run TestDefaultEnvFileIsGenerated -update
func TestDefaultEnvFileIsGenerated(t *testing.T) {
	out, err := run(t, "env")
	if err != nil {
		t.Fatal(err)
	}
	const path = "../packaging/vipd.env"
	if *update {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != out {
		t.Errorf("%s is stale: run go test ./manifest -run TestDefaultEnvFileIsGenerated -update\n--- generated:\n%s", path, out)
	}
	for _, s := range config.Settings() {
		if !strings.Contains(out, "\n#"+s.Env+"=") {
			t.Errorf("default env file lacks a commented %s line", s.Env)
		}
	}
	if strings.Contains(out, "\nVIPD_") {
		t.Error("the default env file sets a value; everything must be commented out")
	}
}
