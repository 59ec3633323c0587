package main

import (
	"bytes"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func run(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errb bytes.Buffer
	code := execute(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCheckConfigFlagsWinOverEnv(t *testing.T) {
	code, out, errs := run(t, map[string]string{"VIPD_ADDRESS": "10.0.0.2/32", "VIPD_PRIORITY": "7", "VIPD_NODE_NAME": "a"},
		"check-config", "--address", "10.0.0.1/32")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"VIPD_ADDRESS=10.0.0.1/32\n", "VIPD_PRIORITY=7\n", "VIPD_MODE=l2\n", "VIPD_NODE_NAME=a\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("check-config output lacks %q:\n%s", want, out)
		}
	}
}

func TestEmptyEnvIsAValue(t *testing.T) {
	code, out, errs := run(t, map[string]string{"VIPD_ADDRESS": "10.0.0.2/32", "VIPD_METRICS_ADDRESS": ""}, "check-config")
	if code != 0 || !strings.Contains(out, "VIPD_METRICS_ADDRESS=\n") {
		t.Fatalf("exit %d, %s\n%s", code, errs, out)
	}
}

func TestInvalidSettingExitCode2OneLine(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"check-config"}, map[string]string{"VIPD_ADDRESS": "10.0.0.0/24"}, `vipd: invalid VIPD_ADDRESS="10.0.0.0/24"`},
		{[]string{"check-config", "--health-timeout", "forever"}, map[string]string{"VIPD_ADDRESS": "10.0.0.1/32"}, `vipd: invalid VIPD_HEALTH_TIMEOUT="forever"`},
		{[]string{"run"}, map[string]string{"VIPD_ADDRESS": "10.0.0.1/32", "VIPD_MODE": "l3"}, `vipd: invalid VIPD_MODE="l3": want one of l2, bgp, cloud`},
		{[]string{"check-config", "--no-such-flag"}, nil, "unknown flag"},
		{[]string{"check-config"}, map[string]string{"VIPD_ADDRESS": "10.0.0.1/32", "VIPD_MODE": "bgp", "VIPD_BGP_LOCAL_AS": "65001"}, "VIPD_BGP_PEERS"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			t.Setenv("VIPD_ADDRESS", "")
			code, out, errs := run(t, tt.env, tt.args...)
			if code != exitConfig || !strings.HasPrefix(errs, tt.want) && !strings.Contains(errs, tt.want) || strings.Count(strings.TrimSpace(errs), "\n") != 0 || out != "" {
				t.Fatalf("exit %d, stderr %q, stdout %q: want exit 2 and one line with %q", code, errs, out, tt.want)
			}
		})
	}
}

func TestUnknownVIPDVariableWarned(t *testing.T) {
	code, _, errs := run(t, map[string]string{"VIPD_ADDRESS": "10.0.0.1/32", "VIPD_ADRESS": "typo"}, "check-config")
	if code != 0 || !strings.Contains(errs, "unknown setting VIPD_ADRESS") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

func TestRunHelpListsEverySetting(t *testing.T) {
	code, out, _ := run(t, nil, "run", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"VIPD_ADDRESS", "--health-interval, VIPD_HEALTH_INTERVAL (default 1s)", "VIPD_BFD_ENABLED", "CLOUDFLARE_API_TOKEN", "Cluster (l2 and cloud election):"} {
		if !strings.Contains(out, want) {
			t.Errorf("run --help lacks %q", want)
		}
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := run(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "vipd dev\ncommit: ") || !strings.HasSuffix(out, "\ngo: "+runtime.Version()+"\n") {
		t.Fatalf("exit %d, %q", code, out)
	}
}

func TestPrintStatus(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 10, 0, time.UTC)
	s := Status{Node: "n1", Version: "v1", Mode: "l2", Interface: "eth0", Started: now.Add(-10 * time.Second),
		Health: &HealthStatus{Healthy: false, Reason: "http_5xx", Error: "HTTP 500", Checked: now.Add(-time.Second), Since: now.Add(-3 * time.Second)},
		VIPs:   []VIPStatus{{VIP: "10.0.0.1/32", Held: false, LastTransition: &Transition{Held: false, At: now.Add(-3 * time.Second), Cause: "apiserver unhealthy: http_5xx"}}}}
	var b bytes.Buffer
	if err := printStatus(&b, s, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"n1 (vipd v1, mode l2, interface eth0, up 10s ago)", "unhealthy since 3s ago (last probe 1s ago: http_5xx, HTTP 500)", "10.0.0.1/32  no    3s ago  apiserver unhealthy: http_5xx"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

func TestCheckConfigEnvFile(t *testing.T) {
	dir := t.TempDir()
	f := dir + "/vipd.env"
	body := "# comment\nVIPD_ADDRESS=10.0.0.9/32\nVIPD_NODE_NAME=\"node-a\"\n#VIPD_MODE=bgp\nVIPD_PRIORITY=3\n"
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIPD_PRIORITY", "1") // the file wins over the inherited environment
	t.Setenv("VIPD_ADDRESS", "10.0.0.1/32")
	t.Setenv("VIPD_NODE_NAME", "x")
	code, out, errs := run(t, nil, "check-config", "--env-file", f, "--priority", "7")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"VIPD_ADDRESS=10.0.0.9/32\n", "VIPD_PRIORITY=7\n", "VIPD_MODE=l2\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
	code, _, errs = run(t, nil, "check-config", "--env-file", dir+"/missing.env")
	if code != exitConfig || !strings.Contains(errs, "--env-file") {
		t.Fatalf("missing file: exit %d %q", code, errs)
	}
}
