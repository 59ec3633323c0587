package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/testenv"
)

func TestManPageListsEverySetting(t *testing.T) {
	var buf bytes.Buffer
	if err := write(&buf, "1.2.3", "2026-11-22"); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if !strings.HasPrefix(page, `.TH VIPD 8 "2026\-11\-22" "vipd 1.2.3"`) {
		t.Errorf("header: %q", strings.SplitN(page, "\n", 2)[0])
	}
	for _, s := range config.Settings() {
		if !strings.Contains(page, `\fB`+esc(s.Env)+`\fR, \fB\-\-`+esc(s.Flag)+`\fR`) {
			t.Errorf("setting %s missing from the man page", s.Env)
		}
	}
}

// TestManPageRendersCleanly runs groff with all warnings on.
func TestManPageRendersCleanly(t *testing.T) {
	testenv.RequireCommands(t, "groff")
	var buf bytes.Buffer
	if err := write(&buf, "1.2.3", "2026-11-22"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("groff", "-man", "-ww", "-z", "-Tutf8")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("groff: %v\n%s", err, out)
	}
}
