// Package cloud holds vipd's cloud-mode integration tests: real vipd
// processes in network namespaces, each node's fake apiserver, and one fake
// DigitalOcean API plus metadata service (internal/fakedo) listening in the
// client namespace, reached over the lab bridge.
package cloud

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/internal/fakehttp"
	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

const (
	token       = "dop_v1_lab"
	reservedIP  = "192.0.2.10"
	dropletBase = 1000 // node n<i> is droplet 1000+i
	actionsPath = "/v2/reserved_ips/" + reservedIP + "/actions"
)

// vipdBuild is the binary every test of the package runs, built once.
var vipdBuild lab.Build

func TestMain(m *testing.M) {
	code := m.Run()
	vipdBuild.Remove()
	os.Exit(code)
}

// vipdBinary checks the prerequisites and returns the vipd binary.
func vipdBinary(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "curl")
	return vipdBuild.Path(t)
}

// nodes is what the labs of both providers share: N nodes, each with a
// fake apiserver, the vipd binary, and a client namespace where the fake
// cloud API listens.
type nodes struct {
	*lab.Lab
	t    *testing.T
	bin  string
	apis []*lab.APIServer
}

func newNodes(t *testing.T, n int) *nodes {
	t.Helper()
	bin := vipdBinary(t)
	l := lab.New(t, lab.Options{Nodes: n, Client: true})
	c := &nodes{Lab: l, t: t, bin: bin}
	for _, n := range l.Nodes {
		api, err := n.StartAPIServer("0.0.0.0:6443", lab.OK)
		if err != nil {
			t.Fatal(err)
		}
		c.apis = append(c.apis, api)
	}
	return c
}

// fakeAddr is where a fake cloud API (and its metadata service) listens:
// the client namespace, reached over the lab bridge.
func (c *nodes) fakeAddr() string { return c.Client.IPv4.String() + ":0" }

// withPeers is env with node i's gossip peers when there are several
// nodes, then extra.
func (c *nodes) withPeers(i int, env []string, extra ...string) []string {
	if len(c.Nodes) > 1 {
		var peers []string
		for j, n := range c.Nodes {
			if j != i {
				peers = append(peers, n.IPv4.String()+":7950")
			}
		}
		env = append(env, "VIPD_PEERS="+strings.Join(peers, ","))
	}
	return append(env, extra...)
}

// startEnv starts vipd on node i; its output is logged if the test fails.
func (c *nodes) startEnv(i int, env []string) *lab.Proc {
	c.t.Helper()
	p, err := c.Nodes[i].StartVipd(c.bin, env...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() {
		if c.t.Failed() {
			c.t.Logf("%s output:\n%s", p.Name, p.Output())
		}
	})
	return p
}

// dumpLog logs a fake's request log if the test failed.
func (c *nodes) dumpLog(title string, reqs []fakehttp.Request) {
	if !c.t.Failed() {
		return
	}
	var b strings.Builder
	for _, r := range reqs {
		fmt.Fprintf(&b, "%s %s %s %s?%s %d %s\n", r.Time.Format("15:04:05.000"), r.Remote, r.Method, r.Path, r.Query, r.Status, r.Body)
	}
	c.t.Logf("%s log:\n%s", title, b.String())
}

// cloudLab is N nodes and the fake DigitalOcean API.
type cloudLab struct {
	*nodes
	fake *fakedo.Server
	vips string
}

func newCloudLab(t *testing.T, n int, fo fakedo.Options) *cloudLab {
	t.Helper()
	c := &cloudLab{nodes: newNodes(t, n), vips: reservedIP + "/32"}
	fo.Token = token
	fo.Listen = c.Client.Listen
	fo.Addr, fo.MetadataAddr = c.fakeAddr(), c.fakeAddr()
	fake, err := fakedo.New(fo)
	if err != nil {
		t.Fatal(err)
	}
	c.OnClose(fake.Close)
	c.fake = fake
	for i, n := range c.Nodes {
		fake.AddDroplet(fakedo.Droplet{ID: droplet(i), Name: n.Name, PublicIPv4: n.IPv4.String()})
	}
	fake.AddReservedIP(reservedIP, 0)
	return c
}

func droplet(i int) int { return dropletBase + i + 1 }

// env is node i's environment: cloud mode against the fake, fast health
// checks, gossip peers when there are several nodes.
func (c *cloudLab) env(i int, extra ...string) []string {
	return c.withPeers(i, []string{
		"VIPD_MODE=cloud",
		"VIPD_ADDRESS=" + c.vips,
		"DIGITALOCEAN_ACCESS_TOKEN=" + token,
		"VIPD_DO_TOKEN_FILE=",
		"VIPD_DO_API_URL=" + c.fake.URL(),
		"VIPD_DO_METADATA_URL=" + c.fake.MetadataURL(droplet(i)),
		"VIPD_DO_DROPLET_ID=",
		"VIPD_HEALTH_INTERVAL=200ms",
		"VIPD_HEALTH_TIMEOUT=500ms",
	}, extra...)
}

func (c *cloudLab) start(i int, extra ...string) *lab.Proc {
	c.t.Helper()
	return c.startEnv(i, c.env(i, extra...))
}

func (c *cloudLab) dumpAPI() { c.dumpLog("fake API", c.fake.Requests()) }

// waitHolder polls the fake until droplet holds the IP and returns when.
func (c *cloudLab) waitHolder(ctx context.Context, want int) (time.Time, error) {
	for {
		if got, _ := c.fake.Holder(reservedIP); got == want {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			got, _ := c.fake.Holder(reservedIP)
			return time.Time{}, fmt.Errorf("reserved IP on droplet %d, want %d: %w", got, want, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// metric returns the value of one series line of node i's /metrics (0 if
// absent), e.g. `vipd_cloud_calls_total{call="assign",outcome="success",provider="digitalocean"}`.
func (c *nodes) metric(ctx context.Context, i int, series string) float64 {
	c.t.Helper()
	out, err := c.Nodes[i].Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/metrics")
	if err != nil {
		c.t.Fatalf("metrics of n%d: %v", i+1, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// cloudStatus returns node i's /status components.cloud section.
func (c *nodes) cloudStatus(ctx context.Context, i int) map[string]any {
	c.t.Helper()
	out, err := c.Nodes[i].Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/status")
	if err != nil {
		c.t.Fatalf("status of n%d: %v", i+1, err)
	}
	var st map[string]any
	if err := json.Unmarshal(out, &st); err != nil {
		c.t.Fatalf("status JSON: %v: %s", err, out)
	}
	comps, _ := st["components"].(map[string]any)
	cs, _ := comps["cloud"].(map[string]any)
	return cs
}

func series(call, outcome string) string {
	return fmt.Sprintf(`vipd_cloud_calls_total{call=%q,outcome=%q,provider="digitalocean"}`, call, outcome)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func posts(f *fakedo.Server) int { return f.Count(http.MethodPost, actionsPath) }

// stopClean stops vipd with SIGTERM, as systemd does, and wants exit
// status 0 within 10 s.
func stopClean(t *testing.T, p *lab.Proc) {
	t.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit after SIGTERM: %d, %v", code, err)
	}
}

// waitOutput waits for a log line fragment.
func waitOutput(t *testing.T, ctx context.Context, p *lab.Proc, substr string) {
	t.Helper()
	if err := p.WaitOutput(ctx, substr); err != nil {
		t.Fatalf("%s never logged %q: %v", p.Name, substr, err)
	}
}
