package migrate

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/bgp"
	"github.com/vipd/vipd/config"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestGolden runs every input under testdata/<tool>/ and compares the env
// file with <input>.golden.env and the warnings with <input>.warnings.
// Regenerate with: go test ./migrate -run TestGolden -update (then review
// the diff: the golden files are the specification).
func TestGolden(t *testing.T) {
	tools := map[string]func(io.Reader) (Result, error){
		"kubevip":  KubeVIP,
		"novaedge": NovaEdge,
	}
	n := 0
	for dir, fn := range tools {
		inputs, err := filepath.Glob(filepath.Join("testdata", dir, "*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range inputs {
			if strings.HasSuffix(in, ".golden.env") || strings.HasSuffix(in, ".warnings") {
				continue
			}
			n++
			t.Run(dir+"/"+filepath.Base(in), func(t *testing.T) {
				f, err := os.Open(in)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				res, err := fn(f)
				if err != nil {
					t.Fatalf("migrate: %v", err)
				}
				var env, warn bytes.Buffer
				if err := res.WriteEnv(&env); err != nil {
					t.Fatal(err)
				}
				if err := res.WriteWarnings(&warn); err != nil {
					t.Fatal(err)
				}
				compareGolden(t, in+".golden.env", env.Bytes())
				compareGolden(t, in+".warnings", warn.Bytes())
				checkLoadsInVipd(t, res, env.Bytes())
			})
		}
	}
	if n < 8 {
		t.Fatalf("only %d golden inputs found; testdata is incomplete", n)
	}
}

func compareGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the output:\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}

// checkLoadsInVipd feeds the generated env file to vipd's own loader: a
// migration whose enabled lines vipd would reject is a bug. Results that
// deliberately leave a required setting commented out are only checked for
// the settings they do set.
func checkLoadsInVipd(t *testing.T, res Result, envFile []byte) {
	t.Helper()
	// The written file must read back to the same values.
	back, err := parseEnvList(envFile)
	if err != nil {
		t.Fatalf("generated env file does not parse back: %v", err)
	}
	set := map[string]string{}
	for _, l := range res.Env {
		if l.Name == "" || l.Disabled {
			continue
		}
		set[l.Name] = l.Value
		v, ok := back.lookup(l.Name)
		if !ok || v.Value != l.Value {
			t.Errorf("%s=%q reads back as %q", l.Name, l.Value, v.Value)
		}
		if _, known := config.Lookup(l.Name); !known {
			t.Errorf("generated %s is not a vipd setting", l.Name)
		}
	}
	for _, l := range res.Env {
		if l.Name != "" && l.Disabled {
			if _, known := config.Lookup(l.Name); !known {
				t.Errorf("suggested %s is not a vipd setting", l.Name)
			}
		}
	}
	if p, ok := set["VIPD_BGP_PEERS"]; ok {
		if _, err := bgp.ParsePeers(p); err != nil {
			t.Errorf("bgp.ParsePeers rejects the generated VIPD_BGP_PEERS: %v", err)
		}
	}
	if _, ok := set["VIPD_ADDRESS"]; !ok {
		return
	}
	if set["VIPD_MODE"] == "bgp" && set["VIPD_BGP_PEERS"] == "" {
		return
	}
	_, err = config.Load(func(s *config.Setting) (string, bool) {
		if s.Env == "VIPD_NODE_NAME" {
			if v, ok := set[s.Env]; ok {
				return v, true
			}
			return "test-node", true
		}
		v, ok := set[s.Env]
		return v, ok
	})
	if err != nil {
		t.Errorf("vipd's config.Load rejects the generated file: %v", err)
	}
}
