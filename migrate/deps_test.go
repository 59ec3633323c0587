package migrate

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/vipd/vipd/internal/testenv"
)

// TestNoKubernetesAPIInVipd keeps k8s.io/* out of the packages vipd links
// for `vipd migrate` and `vipd manifest`: the API types cost the daemon
// about 40 packages and several MB of resident memory it never uses (the
// idle RSS budget is 30 MB). Tests may import them; the code may not.
func TestNoKubernetesAPIInVipd(t *testing.T) {
	testenv.RequireCommands(t, "go")
	out, err := exec.Command("go", "list", "-deps", "github.com/vipd/vipd/migrate", "github.com/vipd/vipd/manifest").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var bad []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "k8s.io/") {
			bad = append(bad, p)
		}
	}
	if len(bad) > 0 {
		t.Errorf("migrate or manifest links %d k8s.io packages: %s", len(bad), strings.Join(bad, " "))
	}
}
