package packaging

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/testenv"
)

// TestEnvFileMatchesSystemd hands env files to systemd itself (PID 1 of the
// booted Debian root, EnvironmentFile= of a oneshot unit that dumps its
// environment) and requires that config.ParseEnvFile, which `vipd
// check-config --env-file` uses, reads exactly the same variables: the
// tricky lines of config/testdata/tricky.env, and every env example in
// docs/*.md. A file systemd refuses (invalid UTF-8) must fail to start the
// unit and be an error for the parser too.
func TestEnvFileMatchesSystemd(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.Short(t)
	testenv.RequireCommands(t, "debootstrap", "systemd-nspawn", "nsenter", "ip", "tar")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	repo := repoRoot(t)

	files := map[string][]byte{} // unit name suffix -> env file
	tricky, err := os.ReadFile(filepath.Join(repo, "config", "testdata", "tricky.env"))
	if err != nil {
		t.Fatal(err)
	}
	files["tricky"] = tricky
	docs, _ := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	for _, doc := range docs {
		for i, blk := range docEnvBlocks(t, doc) {
			files[fmt.Sprintf("%s-%d", strings.TrimSuffix(filepath.Base(doc), ".md"), i)] = blk
		}
	}
	if len(files) < 6 {
		t.Fatalf("only %d env files (tricky.env and docs examples): the docs extraction finds nothing", len(files))
	}
	files["bad-utf8"] = []byte("T_OK=1\nT_BAD=\xff\xfe\n")
	// Differs between systemd versions: checked on its own below.
	files["comment-backslash"] = []byte("# a comment \\\nT_AFTER_COMMENT=1\nT_OK=1\n")

	root := rootfs(ctx, t, repo)
	unitDir := filepath.Join(root, "etc", "systemd", "system")
	names := make([]string, 0, len(files))
	for name, body := range files {
		names = append(names, name)
		envPath := "/etc/envtest/" + name + ".env"
		if err := os.MkdirAll(filepath.Join(root, "etc", "envtest"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, envPath), body, 0o644); err != nil {
			t.Fatal(err)
		}
		// env -0: values may hold newlines. The dump goes to the root's
		// disk, which the test reads from outside.
		unit := "[Service]\nType=oneshot\nEnvironmentFile=" + envPath + "\n" +
			"ExecStart=/usr/bin/env -0\nStandardOutput=truncate:/var/tmp/envtest-" + name + ".out\n"
		if err := os.WriteFile(filepath.Join(unitDir, "envtest-"+name+".service"), []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(names)
	n := newNetwork(ctx, t)
	c := boot(ctx, t, root, n.container)
	t.Logf("systemd in the container: %s", strings.SplitN(c.must(ctx, t, "systemctl", "--version"), "\n", 2)[0])

	version := 0
	fmt.Sscanf(c.must(ctx, t, "systemctl", "--version"), "systemd %d", &version)
	t.Run("comment ending in a backslash", func(t *testing.T) {
		// Before v254 systemd also skips the line after such a comment;
		// ParseEnvFile reads it as v254 and later do and warns.
		name := "comment-backslash"
		c.must(ctx, t, "systemctl", "start", "envtest-"+name+".service")
		dump, err := os.ReadFile(filepath.Join(root, "var", "tmp", "envtest-"+name+".out"))
		if err != nil {
			t.Fatal(err)
		}
		got := "\x00" + string(dump)
		skipped := !strings.Contains(got, "\x00T_AFTER_COMMENT=1\x00")
		if !strings.Contains(got, "\x00T_OK=1\x00") || skipped != (version < 254) {
			t.Fatalf("systemd %d: next line skipped %v, want %v", version, skipped, version < 254)
		}
		f, err := config.ParseEnvFile(files[name])
		if err != nil || f.Map()["T_AFTER_COMMENT"] != "1" || len(f.Warnings) != 1 || !strings.Contains(f.Warnings[0], "before v254") {
			t.Fatalf("ParseEnvFile: %q %q %v", f.Map(), f.Warnings, err)
		}
		t.Logf("systemd %d skipped the line after the comment: %v; the parser warns: %s", version, skipped, f.Warnings[0])
	})
	for _, name := range names {
		if name == "comment-backslash" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			unit := "envtest-" + name + ".service"
			out, startErr := c.exec(ctx, "systemctl", "start", unit)
			parsed, parseErr := config.ParseEnvFile(files[name])
			if startErr != nil || parseErr != nil {
				if startErr == nil || parseErr == nil {
					t.Fatalf("systemd start: %v %s; ParseEnvFile: %v: want both to refuse or both to accept\n%s",
						startErr, out, parseErr, c.journal(ctx, unit))
				}
				t.Logf("refused by both: systemd %q; parser %v", strings.TrimSpace(out), parseErr)
				return
			}
			dump, err := os.ReadFile(filepath.Join(root, "var", "tmp", "envtest-"+name+".out"))
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, kv := range strings.Split(strings.TrimSuffix(string(dump), "\x00"), "\x00") {
				k, v, _ := strings.Cut(kv, "=")
				got[k] = v
			}
			want := parsed.Map()
			// systemd adds its own variables (PATH, INVOCATION_ID...): compare
			// the file's names, and make sure no name the parser dropped
			// reached the unit.
			for k := range got {
				if _, ok := want[k]; !ok && fileMentions(files[name], k) {
					t.Errorf("systemd passed %s=%q, the parser did not", k, got[k])
				}
			}
			sub := map[string]string{}
			for k := range want {
				if v, ok := got[k]; ok {
					sub[k] = v
				}
			}
			if !reflect.DeepEqual(sub, want) {
				for k, v := range want {
					if g, ok := got[k]; !ok || g != v {
						t.Errorf("%s: systemd %q (set %v), parser %q", k, g, ok, v)
					}
				}
			}
		})
	}
}

// fileMentions reports whether name appears in the env file at all (a
// variable systemd added itself does not).
func fileMentions(body []byte, name string) bool {
	return strings.Contains(string(body), name)
}

var docAssign = regexp.MustCompile(`^#?\s?(VIPD_[A-Z0-9_]+|DIGITALOCEAN_ACCESS_TOKEN|HCLOUD_TOKEN|CLOUDFLARE_API_TOKEN)=`)

// docEnvBlocks returns the fenced blocks of a markdown file that are env
// files (only blank lines, comments and setting assignments), the same
// rule as cmd/vipd's docs test, each once as written and once with the
// commented-out settings uncommented.
func docEnvBlocks(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	var cur []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "```") {
			if in {
				env, assigns := true, 0
				var uncommented []string
				for _, x := range cur {
					switch {
					case docAssign.MatchString(x) && !strings.HasPrefix(x, "#"):
						assigns++
						uncommented = append(uncommented, x)
					case docAssign.MatchString(x):
						uncommented = append(uncommented, strings.TrimPrefix(strings.TrimPrefix(x, "#"), " "))
					case x == "" || strings.HasPrefix(x, "#"):
						uncommented = append(uncommented, x)
					default:
						env = false
					}
				}
				if env && assigns > 0 {
					out = append(out, []byte(strings.Join(cur, "\n")+"\n"), []byte(strings.Join(uncommented, "\n")+"\n"))
				}
			}
			in, cur = !in, nil
			continue
		}
		if in {
			cur = append(cur, l)
		}
	}
	return out
}
