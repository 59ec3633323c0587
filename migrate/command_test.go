package migrate

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCmd(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	cmd := Command()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

func TestCommandStdinToStdout(t *testing.T) {
	out, errOut, err := runCmd(t, "vip_arp=true\ncp_enable=true\naddress=10.0.0.9\nvip_startleader=true\n", "kube-vip", "-")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "\nVIPD_ADDRESS=10.0.0.9/32\n") {
		t.Errorf("stdout lacks the address:\n%s", out)
	}
	if !strings.Contains(errOut, "warning: vip_startleader=true did nothing") || strings.Contains(out, "warning:") {
		t.Errorf("warnings not (only) on stderr: stderr=%q", errOut)
	}
}

func TestCommandOutputFile(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "novaedge.env")
	if err := os.WriteFile(in, []byte("NOVAEDGE_CP_VIP_ADDRESS=10.0.0.100/32\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "vipd.env")
	out, _, err := runCmd(t, "", "novaedge", in, "-o", dst)
	if err != nil {
		t.Fatal(err)
	}
	if out != "" {
		t.Errorf("stdout should be empty with -o, got %q", out)
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("\nVIPD_ADDRESS=10.0.0.100/32\n")) {
		t.Errorf("output file:\n%s", b)
	}
	st, _ := os.Stat(dst)
	if st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}
}

func TestCommandBadInputIsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"kube-vip", "-"},
		{"kube-vip", filepath.Join(t.TempDir(), "missing.yaml")},
	} {
		_, _, err := runCmd(t, "address=1.2.3.4\nnot valid\n", args...)
		var ie *InputError
		if !errors.As(err, &ie) || ie.ExitCode() != 2 {
			t.Errorf("%v: err = %v, want an InputError with exit code 2", args, err)
		}
	}
	_, _, err := runCmd(t, "address=1.2.3.4\nnot valid\n", "kube-vip", "-")
	if err == nil || !strings.Contains(err.Error(), "standard input: line 2:") {
		t.Errorf("err = %v, want it to name the input and line 2", err)
	}
}
