package manifest

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite the static-pod golden files in testdata")

// TestStaticPodGolden pins the exact bytes `vipd manifest static-pod`
// prints for several flag combinations: the manifest is what operators
// diff against their deployed files, so any change to it must be
// deliberate. Regenerate with:
// go test ./manifest -run TestStaticPodGolden -update-golden (then review the diff).
func TestStaticPodGolden(t *testing.T) {
	tests := []struct {
		name    string
		version string
		args    []string
	}{
		{"l2-ca-file", "1.2.3", []string{"--address", "10.0.0.100/32,fd00::100/128", "--interface", "eth0", "--peers", "10.0.0.11,10.0.0.12", "--gossip-key-file", "/etc/vipd/gossip.key",
			"--health-ca-file", "/etc/kubernetes/pki/ca.crt"}},
		{"bgp-options", "1.2.3", []string{"--address", "192.0.2.10/32", "--mode", "bgp", "--bgp-local-as", "65010", "--bgp-peers", "192.0.2.1:65000",
			"--state-dir", "/srv/vipd", "--node-name", "cp-7", "--image", "registry.local/vipd:test", "--pod-name", "vip", "--pod-namespace", "infra"}},
		{"all-files-dev", "dev", []string{"--address", "10.0.0.100/32", "--node-name", "", "--gossip-key-file", "/etc/vipd/gossip.key",
			"--sa-token-path", "/etc/vipd/token", "--health-ca-file", "/etc/vipd/ca.crt", "--kubeconfig", "/etc/vipd/kubeconfig",
			"--do-token-file", "/etc/vipd/do-token", "--health-interval", "200ms"}},
		{"minimal-no-version", "", []string{"--address", "10.0.0.100/32"}},
		// The fast profile locks vipd's memory: IPC_LOCK is added.
		{"fast-profile", "1.2.3", []string{"--address", "10.0.0.100/32", "--profile", "fast"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := Command(tc.version, flagsOnly)
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(append([]string{"static-pod"}, tc.args...))
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			checkAsAPITypesPrint(t, out.String())
			path := filepath.Join("testdata", tc.name+".yaml")
			if *updateGolden {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update-golden to create it)", err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Errorf("%s differs from the output:\n--- want\n%s\n--- got\n%s", path, want, out.Bytes())
			}
		})
	}
}

// checkAsAPITypesPrint decodes out strictly into the real v1.Pod, prints
// that Pod again, and checks it reads the same as out, apart from the empty
// fields the API types always print: the local Pod types must neither lose
// nor add anything.
func checkAsAPITypesPrint(t *testing.T, out string) {
	t.Helper()
	p := decodePod(t, out)
	b, err := yaml.Marshal(&p)
	if err != nil {
		t.Fatal(err)
	}
	again := strings.Replace(string(b), "  creationTimestamp: null\n", "", 1)
	again = strings.Replace(again, "status: {}\n", "", 1)
	again = strings.Replace(again, "    resources: {}\n", "", 1)
	body := out[strings.Index(out, "\napiVersion:")+1:]
	if again != body {
		t.Errorf("the API types print the manifest differently:\n--- API types\n%s\n--- manifest\n%s", again, body)
	}
}
