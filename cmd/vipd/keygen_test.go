package main

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/config"
)

func TestKeygenStdout(t *testing.T) {
	code, out, errs := run(t, nil, "keygen")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSuffix(out, "\n"))
	if err != nil || len(key) != 32 || !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 {
		t.Fatalf("keygen printed %q: want one line of base64 of 32 bytes", out)
	}
	_, out2, _ := run(t, nil, "keygen")
	if out2 == out {
		t.Fatal("two keygen runs printed the same key")
	}
	// The file format VIPD_GOSSIP_KEY_FILE is read in gives the same bytes.
	keys, err := config.ParseGossipKeys([]byte(out))
	if err != nil || len(keys) != 1 || !bytes.Equal(keys[0], key) {
		t.Fatalf("ParseGossipKeys(keygen output) = %x, %v; want %x", keys, err, key)
	}
}

func TestKeygenOut(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gossip.key")
	code, out, errs := run(t, nil, "keygen", "--out", path)
	if code != 0 || out != "" {
		t.Fatalf("exit %d, stdout %q, stderr %s", code, out, errs)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v: want 0600", st.Mode(), err)
	}
	first, _ := os.ReadFile(path)
	c := &config.Config{GossipKeyFile: path}
	if err := c.ReadGossipKeys(); err != nil || len(c.GossipKeys) != 1 || len(c.GossipKeys[0]) != 32 {
		t.Fatalf("ReadGossipKeys: %v, %d keys", err, len(c.GossipKeys))
	}

	// An existing key is never replaced without --force.
	code, _, errs = run(t, nil, "keygen", "--out", path)
	if code != exitConfig || !strings.Contains(errs, "exists") || !strings.Contains(errs, "--force") {
		t.Fatalf("second keygen: exit %d, %q: want exit 2 naming --force", code, errs)
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(again, first) {
		t.Fatal("the existing key was changed without --force")
	}

	// --force replaces it, mode 0600 even if the old file was wider, and
	// leaves no temporary file behind.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = run(t, nil, "keygen", "--out", path, "--force")
	if code != 0 {
		t.Fatalf("keygen --force: exit %d: %s", code, errs)
	}
	replaced, _ := os.ReadFile(path)
	st, _ = os.Stat(path)
	if bytes.Equal(replaced, first) || st.Mode().Perm() != 0o600 {
		t.Fatalf("after --force: same key %v, mode %v", bytes.Equal(replaced, first), st.Mode())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("files left in %s: %v", dir, ents)
	}

	// A directory that does not exist: one line, exit 2.
	code, _, errs = run(t, nil, "keygen", "--out", filepath.Join(dir, "no", "such", "gossip.key"))
	if code != exitConfig || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Fatalf("missing directory: exit %d, %q", code, errs)
	}
}

// TestGossipKeyRequired: l2 or cloud with peers and no key refuses to start
// (check-config and run load alike) with one line naming
// VIPD_GOSSIP_KEY_FILE, how to make one, and the opt-out.
func TestGossipKeyRequired(t *testing.T) {
	key := filepath.Join(t.TempDir(), "gossip.key")
	if code, _, errs := run(t, nil, "keygen", "--out", key); code != 0 {
		t.Fatal(errs)
	}
	base := map[string]string{"VIPD_ADDRESS": "10.0.0.100/32", "VIPD_NODE_NAME": "n1", "VIPD_GOSSIP_KEY_FILE": "", "VIPD_GOSSIP_INSECURE": "false"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"l2 with peers, no key", map[string]string{"VIPD_PEERS": "10.0.0.11"}, false},
		{"cloud with peers, no key", map[string]string{"VIPD_MODE": "cloud", "VIPD_PEERS": "10.0.0.11"}, false},
		{"l2 with peers and a key", map[string]string{"VIPD_PEERS": "10.0.0.11", "VIPD_GOSSIP_KEY_FILE": key}, true},
		{"l2 with peers, insecure allowed", map[string]string{"VIPD_PEERS": "10.0.0.11", "VIPD_GOSSIP_INSECURE": "true"}, true},
		{"l2 alone (no gossip)", map[string]string{"VIPD_PEERS": ""}, true},
		{"bgp (no gossip)", map[string]string{"VIPD_MODE": "bgp", "VIPD_PEERS": "10.0.0.11", "VIPD_BGP_LOCAL_AS": "65001", "VIPD_BGP_PEERS": "192.0.2.1:65000", "VIPD_BGP_ROUTER_ID": "10.0.0.1"}, true},
		{"key file missing", map[string]string{"VIPD_PEERS": "10.0.0.11", "VIPD_GOSSIP_KEY_FILE": key + ".missing"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"VIPD_MODE": "l2", "VIPD_PEERS": ""}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tc.env {
				env[k] = v
			}
			code, _, errs := run(t, env, "check-config")
			if tc.ok {
				if code != 0 {
					t.Fatalf("exit %d: %s", code, errs)
				}
				return
			}
			if code != exitConfig || strings.Count(strings.TrimSpace(errs), "\n") != 0 || !strings.Contains(errs, "VIPD_GOSSIP_KEY_FILE") {
				t.Fatalf("exit %d, %q: want exit 2 and one line naming VIPD_GOSSIP_KEY_FILE", code, errs)
			}
			if tc.env["VIPD_GOSSIP_KEY_FILE"] == "" {
				for _, want := range []string{"vipd keygen --out /etc/vipd/gossip.key", "VIPD_GOSSIP_INSECURE=true"} {
					if !strings.Contains(errs, want) {
						t.Errorf("error %q lacks %q", errs, want)
					}
				}
			}
		})
	}
}
