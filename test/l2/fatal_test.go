package l2

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFatalErrorReleasesAndExits: a fatal error while holding the VIP (here
// the vipd-controllers child exits 2, "configuration rejected", which is
// not restarted) releases the VIP and ends vipd with a non-zero exit code
// within 2 s, so systemd sees the failure instead of a process that keeps
// the VIP and hangs.
func TestFatalErrorReleasesAndExits(t *testing.T) {
	l := newLoneLab(t)
	v := l.VIP4(1)
	dir := t.TempDir()
	trigger := filepath.Join(dir, "fail-now")
	fake := filepath.Join(dir, "vipd-controllers")
	script := "#!/bin/sh\n" +
		"echo fake vipd-controllers running\n" +
		"while [ ! -e " + trigger + " ]; do sleep 0.02; done\n" +
		"echo fake vipd-controllers: configuration rejected >&2\n" +
		"exit 2\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	p := l.start(t, "VIPD_ADDRESS="+v.String()+"/32", "VIPD_CONTROLLERS=floatingippool",
		"VIPD_CONTROLLERS_BINARY="+fake, "DIGITALOCEAN_ACCESS_TOKEN=not-used-by-the-fake")
	ctx := ctxT(t, 30*time.Second)
	if err := l.node.WaitAddr(ctx, v, true); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitOutput(ctx, "fake vipd-controllers running"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := os.WriteFile(trigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(10 * time.Second)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("vipd did not exit after the fatal error: %v\n%s", err, p.Output())
	}
	t.Logf("fatal error to exit: %v, exit code %d", took.Round(time.Millisecond), code)
	if code == 0 {
		t.Errorf("exit code 0 after a fatal error, want non-zero")
	}
	if took > 2*time.Second {
		t.Errorf("exit %v after the fatal error, want within 2 s", took.Round(time.Millisecond))
	}
	has, err := l.node.HasAddr(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	if has {
		t.Errorf("VIP %s still on the interface after vipd exited", v)
	}
	out := p.Output()
	for _, want := range []string{"stopping after a fatal error", "VIP released", "vipd stopped"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestUnwritableStateDirStopsStartup: a state directory that cannot be
// written stops `vipd run` with one line naming VIPD_STATE_DIR and a
// non-zero exit, before the VIP is bound or gossip is joined.
func TestUnwritableStateDirStopsStartup(t *testing.T) {
	c := newClusterLab(t, 2)
	n := c.Nodes[0]
	notADir := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	v := c.VIP4(1)
	env := []string{"VIPD_ADDRESS=" + v.String() + "/32", "VIPD_PEERS=" + c.Peers(n), "VIPD_STATE_DIR=" + notADir}
	p, err := n.StartVipd(c.bin, env...)
	if err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(10 * time.Second)
	if err != nil {
		t.Fatalf("vipd kept running with an unwritable state dir: %v\n%s", err, p.Output())
	}
	out := strings.TrimSpace(p.Output())
	if code == 0 || !strings.HasPrefix(out, "vipd: VIPD_STATE_DIR "+notADir+" is not writable") || strings.Contains(out, "\n") {
		t.Fatalf("exit %d, output %q: want non-zero and one line naming VIPD_STATE_DIR", code, out)
	}
	ctx := ctxT(t, 10*time.Second)
	if has, err := n.HasAddr(ctx, v); err != nil || has {
		t.Fatalf("VIP bound (%v, %v) although start-up failed", has, err)
	}
}
