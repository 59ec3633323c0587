package migrate

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// addSeeds adds every input file of testdata/<dir> to the corpus.
func addSeeds(f *testing.F, dir string) {
	paths, _ := filepath.Glob(filepath.Join("testdata", dir, "*"))
	for _, p := range paths {
		if strings.HasSuffix(p, ".golden.env") || strings.HasSuffix(p, ".warnings") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// fuzzMigrator checks a migrator never panics, is deterministic, and that
// whatever it writes reads back as the same assignments.
func fuzzMigrator(t *testing.T, fn func(io.Reader) (Result, error), in []byte) {
	r1, err1 := fn(bytes.NewReader(in))
	r2, err2 := fn(bytes.NewReader(in))
	if (err1 == nil) != (err2 == nil) || (err1 != nil && err1.Error() != err2.Error()) {
		t.Fatalf("non-deterministic error: %v vs %v", err1, err2)
	}
	if !reflect.DeepEqual(r1, r2) {
		t.Fatalf("non-deterministic result")
	}
	if err1 != nil {
		return
	}
	var buf bytes.Buffer
	if err := r1.WriteEnv(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := parseEnvList(buf.Bytes())
	if err != nil {
		t.Fatalf("output does not parse back: %v\n%s", err, buf.String())
	}
	for _, l := range r1.Env {
		if l.Name == "" || l.Disabled {
			continue
		}
		if !strings.HasPrefix(l.Name, "VIPD_") {
			t.Fatalf("output sets %s", l.Name)
		}
		v, ok := back.lookup(l.Name)
		if !ok || v.Value != l.Value {
			t.Fatalf("%s=%q reads back as %q", l.Name, l.Value, v.Value)
		}
	}
	for _, l := range r1.Env {
		if strings.Contains(l.Name, "\n") {
			t.Fatalf("name with newline %q", l.Name)
		}
	}
}

func FuzzKubeVIP(f *testing.F) {
	addSeeds(f, "kubevip")
	f.Add([]byte("vip_arp=true\naddress=10.0.0.1\n"))
	f.Add([]byte("bgp_enable=true\naddress=10.0.0.1,fd00::1\nbgp_peers=[fd00::2]:65000:pw:true:1179::true;1;2;3\n"))
	// Not UTF-8: once written back as U+FFFD.
	f.Add([]byte("control_plane_health_check_address=\xc50"))
	f.Fuzz(func(t *testing.T, in []byte) { fuzzMigrator(t, KubeVIP, in) })
}

func FuzzNovaEdge(f *testing.F) {
	addSeeds(f, "novaedge")
	f.Fuzz(func(t *testing.T, in []byte) { fuzzMigrator(t, NovaEdge, in) })
}

func FuzzParseKubeVIPPeers(f *testing.F) {
	for _, s := range []string{"10.0.0.1:65000", "[2001:db8::1]:65000:::::true;100;100;3", "unnumbered:eth0:65000", "10.0.0.1:65000:pw:true:179:mpbgp_nexthop=fixed:false;;;"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p1, err1 := parseKubeVIPPeers(s)
		p2, err2 := parseKubeVIPPeers(s)
		if (err1 == nil) != (err2 == nil) || !reflect.DeepEqual(p1, p2) {
			t.Fatalf("non-deterministic")
		}
		for _, p := range p1 {
			if p.Address == "" && p.Unnumbered == "" {
				t.Fatalf("peer without address or interface from %q", s)
			}
		}
	})
}
