package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckConfigEnvFileLikeSystemd: --env-file reads the file as systemd's
// EnvironmentFile= does, so what check-config accepts starts under systemd.
func TestCheckConfigEnvFileLikeSystemd(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		code       int
		stdout     string // a line check-config prints
		stderr     string
	}{
		{"inline comment is part of the value", "VIPD_ADDRESS=10.0.0.9/32\nVIPD_MODE=l2 # the mode\n",
			exitConfig, "", `invalid VIPD_MODE="l2 # the mode"`},
		{"comment line", "VIPD_ADDRESS=10.0.0.9/32\n  # VIPD_MODE=bgp\n; VIPD_MODE=cloud\n", 0, "VIPD_MODE=l2\n", ""},
		{"quoted value keeps blanks that config trims", "VIPD_ADDRESS=10.0.0.9/32\nVIPD_NODE_NAME=' node-b '\n", 0, "VIPD_NODE_NAME=node-b\n", ""},
		{"continuation", "VIPD_ADDRESS=10.0.0.9/32,\\\nfd00::9/128\n", 0, "VIPD_ADDRESS=10.0.0.9/32,fd00::9/128\n", ""},
		{"export line is ignored by systemd: warned", "VIPD_ADDRESS=10.0.0.9/32\nexport VIPD_PRIORITY=5\n", 0, "VIPD_PRIORITY=0\n",
			`"export VIPD_PRIORITY" is not a valid variable name`},
		{"invalid UTF-8 refused", "VIPD_ADDRESS=10.0.0.9/32\nVIPD_NODE_NAME=\xff\n", exitConfig, "", "line 2: invalid UTF-8 in the value of VIPD_NODE_NAME"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("VIPD_ADDRESS", "")
			t.Setenv("VIPD_MODE", "")
			os.Unsetenv("VIPD_MODE")
			t.Setenv("VIPD_NODE_NAME", "n")
			t.Setenv("VIPD_PRIORITY", "0")
			f := filepath.Join(t.TempDir(), "vipd.env")
			if err := os.WriteFile(f, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out, errs := run(t, nil, "check-config", "--env-file", f)
			if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errs, tc.stderr) {
				t.Fatalf("exit %d (want %d)\nstdout %q (want %q)\nstderr %q (want %q)", code, tc.code, out, tc.stdout, errs, tc.stderr)
			}
		})
	}
}
