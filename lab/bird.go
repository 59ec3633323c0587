package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/template"
	"time"
)

// BIRDPath is where Debian's bird2 package installs the daemon.
const BIRDPath = "/usr/sbin/bird"

// BIRD is a BIRD 2 router running in the foreground inside a lab host's
// namespace, with its control socket and configuration in a temporary
// directory (nothing is written to /etc/bird or /run/bird).
type BIRD struct {
	Host   *Host
	Config string
	dir    string
	proc   *Proc
}

// StartBIRD starts bird with conf and waits until birdc answers. The
// router is stopped when the lab closes.
func (h *Host) StartBIRD(ctx context.Context, conf string) (*BIRD, error) {
	dir, err := os.MkdirTemp("", "vipd-bird-")
	if err != nil {
		return nil, err
	}
	b := &BIRD{Host: h, Config: conf, dir: dir}
	h.lab.OnClose(b.cleanup)
	if err := b.Start(ctx); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

func (b *BIRD) socket() string { return filepath.Join(b.dir, "bird.ctl") }

// Start (re)starts bird and waits for its control socket to answer.
func (b *BIRD) Start(ctx context.Context) error {
	conf := filepath.Join(b.dir, "bird.conf")
	if err := os.WriteFile(conf, []byte(b.Config), 0o600); err != nil {
		return err
	}
	_ = os.Remove(b.socket())
	p, err := b.Host.Start("bird", nil, BIRDPath, "-f", "-c", conf, "-s", b.socket(), "-P", filepath.Join(b.dir, "bird.pid"))
	if err != nil {
		return err
	}
	b.proc = p
	for {
		if _, err := os.Stat(b.socket()); err == nil {
			if _, err := b.Birdc(ctx, "show status"); err == nil {
				return nil
			}
		}
		if p.Exited() {
			return fmt.Errorf("bird exited at start:\n%s", p.Output())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bird: control socket not ready: %w\n%s", ctx.Err(), p.Output())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop stops bird (SIGTERM, then SIGKILL after 5 s). BIRD removes the
// kernel routes it exported when it shuts down.
func (b *BIRD) Stop() {
	if b.proc == nil || b.proc.Exited() {
		return
	}
	_ = b.proc.Signal(syscall.SIGTERM)
	if _, err := b.proc.Wait(5 * time.Second); err != nil {
		b.proc.Kill()
	}
}

// Restart stops and starts bird with the same configuration.
func (b *BIRD) Restart(ctx context.Context) error {
	b.Stop()
	return b.Start(ctx)
}

func (b *BIRD) cleanup() {
	b.Stop()
	_ = os.RemoveAll(b.dir)
}

// Logs returns what bird printed.
func (b *BIRD) Logs() string {
	if b.proc == nil {
		return ""
	}
	return b.proc.Output()
}

// Birdc runs one birdc command against this router.
func (b *BIRD) Birdc(ctx context.Context, cmd string) (string, error) {
	args := append([]string{"-s", b.socket()}, strings.Fields(cmd)...)
	out, err := exec.CommandContext(ctx, "birdc", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("birdc %s: %w: %s", cmd, err, out)
	}
	return string(out), nil
}

// BIRDRouter is the BIRD twin of BGPRouter: one AS accepting dynamic eBGP
// neighbours from the lab subnets (BIRD is passive for those; vipd dials),
// ECMP into the kernel, optional MD5 and BFD.
type BIRDRouter struct {
	AS       uint32
	RouterID netip.Addr
	Ranges   []netip.Prefix
	Password string // MD5 for every neighbour; empty: none
	// Keepalive and Hold in seconds; 0: 3 and 9.
	Keepalive, Hold int
	BFD             *BFDProfile
	Debug           bool
	// VIPs, when set, are the only prefixes accepted from the nodes.
	VIPs []netip.Prefix
}

var birdTmpl = template.Must(template.New("bird").Parse(`log stderr all;
router id {{.RouterID}};
{{- if .Debug}}
debug protocols { states, events };
{{- end}}

protocol device {
  scan time 10;
}

protocol kernel kernel4 {
  ipv4 { import none; export where source = RTS_BGP; };
  merge paths on;
}

protocol kernel kernel6 {
  ipv6 { import none; export where source = RTS_BGP; };
  merge paths on;
}
{{- if .BFD}}

protocol bfd {
  interface "*" {
    min rx interval {{.BFD.ReceiveInterval}} ms;
    min tx interval {{.BFD.TransmitInterval}} ms;
    multiplier {{.BFD.DetectMultiplier}};
  };
}
{{- end}}
{{- range .Groups}}

protocol bgp {{.Name}} {
  local as {{$.AS}};
  neighbor range {{.Range}} external;
  dynamic name "{{.Name}}_";
  hold time {{$.HT}};
  keepalive time {{$.KA}};
  connect delay time 1;
  error wait time 1, 10;
{{- if $.Password}}
  password "{{$.Password}}";
{{- end}}
{{- if $.BFD}}
  bfd on;
{{- end}}
  {{.AF}} { import {{.Import}}; export none; };
}
{{- end}}
`))

// Render returns the bird.conf text.
func (r BIRDRouter) Render() (string, error) {
	if r.AS == 0 || !r.RouterID.Is4() || len(r.Ranges) == 0 {
		return "", errors.New("lab: BIRDRouter needs AS, an IPv4 RouterID and at least one range")
	}
	if strings.ContainsAny(r.Password, "\"\\\n") {
		return "", errors.New("lab: BIRDRouter password cannot contain '\"', '\\' or a newline (bird.conf string)")
	}
	type group struct {
		Name, AF, Import string
		Range            netip.Prefix
	}
	data := struct {
		BIRDRouter
		KA, HT int
		Groups []group
	}{BIRDRouter: r, KA: r.Keepalive, HT: r.Hold}
	if data.KA == 0 {
		data.KA = 3
	}
	if data.HT == 0 {
		data.HT = 9
	}
	for i, p := range r.Ranges {
		af := "ipv4"
		if p.Addr().Is6() {
			af = "ipv6"
		}
		g := group{Name: fmt.Sprintf("nodes%d", i), AF: af, Range: p.Masked(), Import: "all"}
		var vips []string
		for _, v := range r.VIPs {
			if v.Addr().Is4() == p.Addr().Is4() {
				vips = append(vips, v.String())
			}
		}
		if len(vips) > 0 {
			g.Import = "where net ~ [ " + strings.Join(vips, ", ") + " ]"
		}
		data.Groups = append(data.Groups, g)
	}
	var b strings.Builder
	if err := birdTmpl.Execute(&b, data); err != nil {
		return "", err
	}
	return b.String(), nil
}
