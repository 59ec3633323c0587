package l2

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSecretsNeverLogged runs vipd at debug level with every kind of secret
// configured (the DigitalOcean and Cloudflare tokens in the environment, a
// BGP peer password, a gossip peer) through start-up, BGP connection
// attempts and a stop, and requires that no secret appears in its output.
func TestSecretsNeverLogged(t *testing.T) {
	const mark = "Sekr1tMark"
	l := newLoneLab(t)
	v := l.VIP4(1)
	// The peer is the lab's client namespace: nothing answers BGP there, so
	// vipd keeps trying to connect (and logs about it) with the password.
	p := l.start(t, "VIPD_ADDRESS="+v.String()+"/32", "VIPD_MODE=bgp", "VIPD_BGP_LOCAL_AS=65001",
		"VIPD_BGP_ROUTER_ID="+l.node.IPv4.String(),
		"VIPD_BGP_PEERS="+l.Client.IPv4.String()+":65000:password=pw"+mark+":hold=9s",
		"DIGITALOCEAN_ACCESS_TOKEN=dop_v1_"+mark, "CLOUDFLARE_API_TOKEN=cf_"+mark)
	ctx := ctxT(t, 20*time.Second)
	if err := p.WaitOutput(ctx, "vipd started"); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitOutput(ctx, "bgp peer configured"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // connection attempts, health checks, announcements
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(5 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit %d, %v", code, err)
	}
	out := p.Output()
	if strings.Contains(out, mark) {
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, mark) {
				t.Errorf("secret in the log: %s", line)
			}
		}
	}
	if !strings.Contains(out, "level=DEBUG") {
		t.Fatalf("no debug output: the test did not see what it checks\n%s", out)
	}
}
