package migrate

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestMetalLBGolden translates MetalLB's documented examples (written from
// MetalLB's field names) under testdata/metallb/ and compares the YAML with
// <input>.golden.yaml and the warnings with <input>.warnings. Regenerate
// with: go test ./migrate -run TestMetalLBGolden -update (and review).
func TestMetalLBGolden(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join("testdata", "metallb", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, in := range inputs {
		if strings.HasSuffix(in, ".golden.yaml") {
			continue
		}
		n++
		t.Run(filepath.Base(in), func(t *testing.T) {
			f, err := os.Open(in)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			res, err := MetalLB(f)
			if err != nil {
				t.Fatalf("migrate: %v", err)
			}
			var out, warn bytes.Buffer
			if err := res.WriteYAML(&out); err != nil {
				t.Fatal(err)
			}
			if err := res.WriteWarnings(&warn); err != nil {
				t.Fatal(err)
			}
			compareGolden(t, strings.TrimSuffix(in, ".yaml")+".golden.yaml", out.Bytes())
			compareGolden(t, strings.TrimSuffix(in, ".yaml")+".warnings", warn.Bytes())
			if strings.Contains(out.String()+warn.String(), "s3cret") {
				t.Error("a BGP password was echoed")
			}
			// Every document is an IPPool with addresses and a mode.
			for _, doc := range strings.Split(out.String(), "\n---\n")[1:] {
				var p IPPoolOut
				if err := yaml.Unmarshal([]byte(doc), &p); err != nil {
					t.Fatalf("output does not parse: %v\n%s", err, doc)
				}
			}
		})
	}
	if n < 5 {
		t.Fatalf("only %d MetalLB inputs", n)
	}
}

func TestMetalLBBadInput(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "empty"},
		{"no pools", "apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {name: x}\n", "no MetalLB IPAddressPool"},
		{"reversed range", "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [192.0.2.9-192.0.2.1]}\n", "starts after it ends"},
		{"mixed range", "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [192.0.2.1-2001:db8::1]}\n", "one family"},
		{"garbage address", "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [nope]}\n", "neither a CIDR"},
		{"no addresses", "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {}\n", "spec.addresses is empty"},
		{"bad yaml", "kind: [\n", "document 1"},
		{"no kind", "metadata: {name: p}\n", "without kind"},
	} {
		_, err := MetalLB(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestMetalLBCommand(t *testing.T) {
	out, errOut, err := runCmd(t, "", "metallb", filepath.Join("testdata", "metallb", "bgp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join("testdata", "metallb", "bgp.golden.yaml"))
	if out != string(want) {
		t.Errorf("stdout differs from the golden file:\n%s", out)
	}
	if !strings.Contains(errOut, "warning: BGPPeer metallb-system/sample") || strings.Contains(out, "warning:") {
		t.Errorf("warnings not (only) on stderr: %q", errOut)
	}
	dst := filepath.Join(t.TempDir(), "pools.yaml")
	if _, _, err := runCmd(t, "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [192.0.2.0/28]}\n", "metallb", "-", "-o", dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst); err != nil || !strings.Contains(string(b), "name: p\n") {
		t.Errorf("output file: %s %v", b, err)
	}
	_, _, err = runCmd(t, "kind: IPAddressPool\n", "metallb", "-")
	var ie *InputError
	if !errors.As(err, &ie) || ie.ExitCode() != 2 {
		t.Errorf("bad input: %v, want an InputError (exit 2)", err)
	}
}
