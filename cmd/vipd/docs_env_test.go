package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vipd/vipd/config"
)

// envLine is an assignment of a vipd setting as it appears in an env file.
var envLine = regexp.MustCompile(`^(VIPD_[A-Z0-9_]+|DIGITALOCEAN_ACCESS_TOKEN|HCLOUD_TOKEN|CLOUDFLARE_API_TOKEN)=`)

// commentedEnvLine is such an assignment commented out ("#VIPD_X=..." or
// "# VIPD_X=..."): an operator uncomments it, so it must work too.
var commentedEnvLine = regexp.MustCompile(`^#\s?((VIPD_[A-Z0-9_]+|DIGITALOCEAN_ACCESS_TOKEN|HCLOUD_TOKEN|CLOUDFLARE_API_TOKEN)=.*)$`)

type docBlock struct {
	where string // file:line of the opening fence
	lines []string
}

// envBlocks returns the fenced blocks of a markdown file that are env
// files: every line is blank, a comment or an assignment of a setting, and
// at least one line assigns one.
func envBlocks(path string) ([]docBlock, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []docBlock
	var cur *docBlock
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			if cur == nil {
				cur = &docBlock{where: fmt.Sprintf("%s:%d", filepath.Base(path), i+1)}
				continue
			}
			if isEnvBlock(cur.lines) {
				out = append(out, *cur)
			}
			cur = nil
			continue
		}
		if cur != nil {
			cur.lines = append(cur.lines, trimmed)
		}
	}
	return out, nil
}

func isEnvBlock(lines []string) bool {
	assigns := 0
	for _, l := range lines {
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case envLine.MatchString(l):
			assigns++
		default:
			return false
		}
	}
	return assigns > 0
}

// TestDocsEnvExamplesReadAsSystemdReadsThem takes every env file example in
// docs/*.md, reads it as systemd's EnvironmentFile= would, once as written
// and once with every commented-out setting uncommented, and requires that
// no value carries a would-be comment and that `vipd check-config
// --env-file` accepts it.
func TestDocsEnvExamplesReadAsSystemdReadsThem(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs found: %v", err)
	}
	total := 0
	for _, doc := range docs {
		blocks, err := envBlocks(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, blk := range blocks {
			total++
			asWritten := strings.Join(blk.lines, "\n") + "\n"
			var uncommented []string
			for _, l := range blk.lines {
				if m := commentedEnvLine.FindStringSubmatch(l); m != nil {
					l = m[1]
				}
				uncommented = append(uncommented, l)
			}
			for _, variant := range []struct{ name, body string }{
				{"as written", asWritten},
				{"uncommented", strings.Join(uncommented, "\n") + "\n"},
			} {
				t.Run(blk.where+"/"+variant.name, func(t *testing.T) {
					checkDocEnv(t, variant.body)
				})
			}
		}
	}
	// docs/l2.md, cloud.md, migration.md and others have examples: a
	// change in the detection must not silently test nothing.
	if total < 5 {
		t.Fatalf("found %d env examples in docs/*.md, want at least 5", total)
	}
}

func checkDocEnv(t *testing.T, body string) {
	t.Helper()
	f, err := config.ParseEnvFile([]byte(body))
	if err != nil {
		t.Fatalf("systemd would refuse this file: %v\n%s", err, body)
	}
	if len(f.Warnings) > 0 {
		t.Errorf("systemd ignores lines: %q\n%s", f.Warnings, body)
	}
	for _, v := range f.Vars {
		if i := strings.IndexAny(v.Value, "#;"); i > 0 && strings.ContainsAny(v.Value[i-1:i], " \t") {
			t.Errorf("%s=%q: systemd keeps an inline comment as part of the value; put comments on their own line", v.Name, v.Value)
		}
	}
	// check-config must accept what systemd passes. A complete example
	// (it sets VIPD_ADDRESS or VIPD_CONTROLLERS) is checked as it is; in a
	// fragment (a few lines, sometimes alternatives of one setting) each
	// assignment is checked on its own over a minimal configuration.
	if _, ok := f.Map()["VIPD_ADDRESS"]; ok || f.Map()["VIPD_CONTROLLERS"] != "" {
		checkConfigAccepts(t, body)
		return
	}
	for _, l := range strings.Split(body, "\n") {
		if !envLine.MatchString(l) {
			continue
		}
		base := []string{"VIPD_ADDRESS=10.0.0.100/32", "VIPD_GOSSIP_KEY_FILE=/etc/vipd/gossip.key"}
		if strings.HasPrefix(l, "VIPD_BGP_") || strings.HasPrefix(l, "VIPD_BFD_") {
			base = append(base, "VIPD_MODE=bgp", "VIPD_BGP_LOCAL_AS=65001", "VIPD_BGP_ROUTER_ID=10.0.0.11", "VIPD_BGP_PEERS=192.0.2.1:65000")
		}
		checkConfigAccepts(t, strings.Join(append(base, l), "\n")+"\n")
	}
}

// checkConfigAccepts runs `vipd check-config --env-file` on body.
func checkConfigAccepts(t *testing.T, body string) {
	t.Helper()
	// Settings the example leaves out must not come from this test's
	// environment (applyEnvFile sets the process environment).
	for _, s := range config.Settings() {
		t.Setenv(s.Env, "")
		os.Unsetenv(s.Env)
	}
	// The key file the examples name is made here.
	dir := t.TempDir()
	key := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(key, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	body = strings.ReplaceAll(body, "=/etc/vipd/gossip.key\n", "="+key+"\n")
	envFile := filepath.Join(dir, "vipd.env")
	if err := os.WriteFile(envFile, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs := run(t, nil, "check-config", "--env-file", envFile)
	if code != 0 {
		t.Errorf("check-config exit %d: %s\n%s", code, errs, body)
	}
}
