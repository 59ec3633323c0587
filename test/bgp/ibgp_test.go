package bgp_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// TestIBGPLocalPref is the iBGP form of the active/backup recipe: the nodes
// are in the router's AS and the backup sends LOCAL_PREF 50 (the primary
// the default 100), so FRR installs only the primary, moves to the backup
// when the primary withdraws, and back when it returns.
func TestIBGPLocalPref(t *testing.T) {
	testenvShort(t)
	e := newEnv(t, setup{nodes: 2, ibgp: true, vipdEnv: []string{fmt.Sprintf("VIPD_BGP_LOCAL_AS=%d", routerAS)}})
	n1, n2 := e.nodes[0], e.nodes[1]
	n2.env = append(n2.env, "VIPD_BGP_LOCAL_PREF=50")
	e.startAll()
	e.waitBGP(vip4, 30*time.Second, n1, n2) // both paths known...
	e.waitKernel(vip4, 10*time.Second, n1)  // ...only the preferred one used
	e.waitBGP(vip6, 30*time.Second, n1, n2)
	e.waitKernel(vip6, 10*time.Second, n1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := e.frr.Vtysh(ctx, "show bgp ipv4 unicast "+vip4.String()+" json")
	if err != nil {
		t.Fatal(err)
	}
	lp := frrLocalPrefs(t, out)
	if lp[n1.h.IPv4.String()] != 100 || lp[n2.h.IPv4.String()] != 50 {
		t.Errorf("FRR local preferences %v, want n1 100 (default) and n2 50", lp)
	}
	if err := n1.api.SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	e.waitKernel(vip4, 10*time.Second, n2)
	e.waitKernel(vip6, 10*time.Second, n2)
	if err := n1.api.SetMode(lab.OK); err != nil {
		t.Fatal(err)
	}
	e.waitKernel(vip4, 10*time.Second, n1)
	e.waitKernel(vip6, 10*time.Second, n1)
}
