package packaging

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/internal/testenv"
)

// TestVersionFromGit checks build.sh's conversion of `git describe` into a
// package version, and that the versions sort as releases should for dpkg.
func TestVersionFromGit(t *testing.T) {
	testenv.RequireCommands(t, "dpkg")
	build := filepath.Join(repoRoot(t), "packaging", "build.sh")
	version := func(describe string) string {
		out, err := exec.Command(build, "--print-version", describe).CombinedOutput()
		if err != nil {
			t.Fatalf("build.sh --print-version %s: %v\n%s", describe, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for describe, want := range map[string]string{
		"v1.2.3":                  "1.2.3",
		"v1.2.3-dirty":            "1.2.3.dirty",
		"v1.2.3-4-gabc1234":       "1.2.3+git4.abc1234",
		"v1.2.3-4-gabc1234-dirty": "1.2.3+git4.abc1234.dirty",
		"v1.3.0-rc1":              "1.3.0~rc1",
		"v1.3.0-rc1-2-gdef5678":   "1.3.0~rc1+git2.def5678",
		"2.0":                     "2.0",
	} {
		if got := version(describe); got != want {
			t.Errorf("%s -> %s, want %s", describe, got, want)
		}
	}
	for _, sha := range []string{"abc1234", "4712855", "4712855-dirty"} {
		if got := version(sha); !strings.HasPrefix(got, "0.0.0~git") || !strings.Contains(got, "."+strings.TrimSuffix(sha, "-dirty")) {
			t.Errorf("untagged commit %s -> %s, want 0.0.0~gitN.%s", sha, got, sha)
		}
	}
	// Each version must sort strictly before the next one.
	order := []string{"abc1234", "v0.1.0-rc1", "v0.1.0-rc1-3-gaaaaaaa", "v0.1.0", "v0.1.0-1-gbbbbbbb", "v0.1.0-12-gccccccc", "v0.2.0"}
	for i := 1; i < len(order); i++ {
		a, b := version(order[i-1]), version(order[i])
		if err := exec.Command("dpkg", "--compare-versions", a, "lt", b).Run(); err != nil {
			t.Errorf("dpkg does not sort %s (%s) before %s (%s)", a, order[i-1], b, order[i])
		}
	}
}

// TestUnitFileVerifies runs systemd-analyze verify on vipd.service (with
// ExecStart pointed at a stand-in, since vipd is not installed on the
// host); any warning fails the test.
func TestUnitFileVerifies(t *testing.T) {
	testenv.RequireCommands(t, "systemd-analyze")
	unit, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging", "vipd.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "\nExecStart=/usr/bin/vipd run\n") {
		t.Fatal("ExecStart is not /usr/bin/vipd run")
	}
	dir := t.TempDir()
	stub := filepath.Join(dir, "vipd")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cleanup, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging", "vipd-cleanup.service"))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for name, body := range map[string][]byte{"vipd.service": unit, "vipd-cleanup.service": cleanup} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(body), "/usr/bin/vipd", stub)), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	out, err := exec.CommandContext(context.Background(), "systemd-analyze", append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// A vipd that fails for good (restart limit, killed at the stop
	// timeout) has its leftovers removed by vipd cleanup (cmd/vipd).
	for _, want := range []string{
		"Type=oneshot", "EnvironmentFile=/etc/vipd/vipd.env", "ExecStart=/usr/bin/vipd cleanup",
		"CapabilityBoundingSet=CAP_NET_ADMIN", "NoNewPrivileges=yes", "ProtectSystem=strict",
	} {
		if !strings.Contains(string(cleanup), "\n"+want+"\n") {
			t.Errorf("vipd-cleanup.service lacks %q", want)
		}
	}
	if strings.Contains(string(cleanup), "[Install]") {
		t.Error("vipd-cleanup.service has an [Install] section: only vipd.service's OnFailure= starts it")
	}
	for _, want := range []string{
		"OnFailure=vipd-cleanup.service",
		"Type=notify", "Restart=always", "RestartSec=1", "RestartPreventExitStatus=2",
		"After=network-online.target", "Wants=network-online.target",
		"After=kubelet.service containerd.service crio.service docker.service",
		"EnvironmentFile=/etc/vipd/vipd.env", "CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE",
		"AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE", "NoNewPrivileges=yes", "ProtectSystem=strict",
		"StateDirectory=vipd", "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK AF_PACKET",
		"KillSignal=SIGTERM", "TimeoutStopSec=5", "LimitMEMLOCK=infinity",
	} {
		if !strings.Contains(string(unit), "\n"+want+"\n") {
			t.Errorf("vipd.service lacks %q", want)
		}
	}
}

// TestMaintainerScriptsParse checks the scripts with sh -n (dash on
// Debian, the shell dpkg and rpm run them with).
func TestMaintainerScriptsParse(t *testing.T) {
	scripts, _ := filepath.Glob(filepath.Join(repoRoot(t), "packaging", "scripts", "*.sh"))
	if len(scripts) != 3 {
		t.Fatalf("scripts: %v", scripts)
	}
	for _, s := range append(scripts, filepath.Join(repoRoot(t), "packaging", "build.sh")) {
		if out, err := exec.Command("sh", "-n", s).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", s, err, out)
		}
	}
}

// unitList returns every value of key in the [Unit] section, split on
// white space (After= and Before= accumulate).
func unitList(unit, key string) []string {
	var out []string
	section := ""
	for _, line := range strings.Split(unit, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Unit]" && strings.HasPrefix(line, key+"="):
			out = append(out, strings.Fields(strings.TrimPrefix(line, key+"="))...)
		}
	}
	return out
}

// TestUnitStopsBeforeKubelet: on reboot or shutdown systemd stops units in
// the reverse of their start order, so vipd must be ordered after the
// kubelet and the container runtimes (and never before them) to stop, and
// hand its VIPs over, while the local apiserver still runs (issue 28).
// The unit is verified next to a kubelet.service as kubeadm's package
// installs it: no ordering cycle, no warning.
func TestUnitStopsBeforeKubelet(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging", "vipd.service"))
	if err != nil {
		t.Fatal(err)
	}
	after, before := unitList(string(unit), "After"), unitList(string(unit), "Before")
	for _, u := range []string{"kubelet.service", "containerd.service", "crio.service", "docker.service", "network-online.target"} {
		if !slices.Contains(after, u) {
			t.Errorf("vipd.service is not After=%s (After: %v): it would stop after it", u, after)
		}
		if slices.Contains(before, u) {
			t.Errorf("vipd.service is Before=%s: it would stop after it", u)
		}
	}
	for _, key := range []string{"Requires", "Wants", "BindsTo", "Requisite"} {
		if l := unitList(string(unit), key); slices.Contains(l, "kubelet.service") {
			t.Errorf("vipd.service %s=kubelet.service: vipd must not pull in or depend on the kubelet", key)
		}
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		testenv.Missing(t, "systemd-analyze (package systemd)")
	}
	dir := t.TempDir()
	stub := filepath.Join(dir, "vipd")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	kubelet := "[Unit]\nDescription=kubelet\nWants=network-online.target\nAfter=network-online.target\n\n" +
		"[Service]\nExecStart=" + stub + "\nRestart=always\n\n[Install]\nWantedBy=multi-user.target\n"
	cleanup, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging", "vipd-cleanup.service"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"vipd.service":         strings.ReplaceAll(string(unit), "/usr/bin/vipd", stub),
		"vipd-cleanup.service": strings.ReplaceAll(string(cleanup), "/usr/bin/vipd", stub),
		"kubelet.service":      kubelet,
	}
	var paths []string
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	out, err := exec.CommandContext(t.Context(), "systemd-analyze", append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
