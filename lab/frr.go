package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"
)

// FRRDir is where Debian installs the FRR daemons.
const FRRDir = "/usr/lib/frr"

// FRR is a router made of FRR's zebra, bgpd and bfdd running inside a lab
// host's namespace, in the foreground (their output is kept in each Proc),
// under an FRR pathspace (-N) of their own: sockets and pid files go to
// /var/run/frr/<pathspace>/, which Close removes. Configuration is applied
// with vtysh from a file in a temporary directory, so nothing is written
// to /etc/frr.
type FRR struct {
	Host      *Host
	Pathspace string
	Config    string // the frr.conf text applied at start
	dir       string // temp dir with frr.conf
	procs     []*Proc
}

// FRRDaemons are the daemons started, zebra first.
var frrDaemons = []string{"zebra", "bgpd", "bfdd"}

// StartFRR starts zebra, bgpd and bfdd in the host's namespace and applies
// conf (an integrated frr.conf). It waits until every daemon answers vtysh.
// The router is stopped when the lab closes.
func (h *Host) StartFRR(ctx context.Context, conf string) (*FRR, error) {
	dir, err := os.MkdirTemp("", "vipd-frr-")
	if err != nil {
		return nil, err
	}
	f := &FRR{Host: h, Pathspace: h.NS, Config: conf, dir: dir}
	h.lab.OnClose(f.cleanup)
	if err := f.Start(ctx); err != nil {
		f.Stop()
		return nil, err
	}
	return f, nil
}

func (f *FRR) runDir() string { return filepath.Join("/var/run/frr", f.Pathspace) }

func frrIDs() (int, int, error) {
	u, err := user.Lookup("frr")
	if err != nil {
		return 0, 0, fmt.Errorf("frr user: %w (is the frr package installed?)", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// Start (re)starts the daemons and applies the configuration.
func (f *FRR) Start(ctx context.Context) error {
	uid, gid, err := frrIDs()
	if err != nil {
		return err
	}
	for _, d := range []string{f.runDir(), f.dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.Chown(d, uid, gid); err != nil {
			return err
		}
	}
	confPath := filepath.Join(f.dir, "frr.conf")
	if err := os.WriteFile(confPath, []byte(f.Config), 0o644); err != nil {
		return err
	}
	f.procs = nil
	for _, d := range frrDaemons {
		// Empty per-daemon files: the configuration comes through vtysh.
		if err := os.WriteFile(filepath.Join(f.dir, d+".conf"), nil, 0o644); err != nil {
			return err
		}
	}
	for _, d := range frrDaemons {
		args := []string{"-N", f.Pathspace, "-F", "traditional", "-P", "0", "--log", "stdout",
			"-f", filepath.Join(f.dir, d+".conf")}
		if d == "zebra" {
			args = append(args, "-s", "90000000")
		}
		p, err := f.Host.Start("frr-"+d, nil, filepath.Join(FRRDir, d), args...)
		if err != nil {
			return err
		}
		f.procs = append(f.procs, p)
		if d == "zebra" {
			// bgpd and bfdd connect to zebra's socket; start them once it exists.
			if err := waitFile(ctx, filepath.Join(f.runDir(), "zserv.api"), p); err != nil {
				return err
			}
		}
	}
	for i, d := range frrDaemons {
		if err := waitFile(ctx, filepath.Join(f.runDir(), d+".vty"), f.procs[i]); err != nil {
			return err
		}
	}
	out, err := exec.CommandContext(ctx, "vtysh", "-N", f.Pathspace, "-f", confPath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("frr %s: apply config: %w: %s", f.Pathspace, err, out)
	}
	return nil
}

func waitFile(ctx context.Context, path string, p *Proc) error {
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("%s exited before creating %s:\n%s", p.Name, path, p.Output())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %s not created: %w\n%s", p.Name, path, ctx.Err(), p.Output())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop stops the daemons (SIGTERM, then SIGKILL after 5 s). zebra removes
// the routes it installed when terminated this way.
func (f *FRR) Stop() {
	for i := len(f.procs) - 1; i >= 0; i-- {
		p := f.procs[i]
		if p.Exited() {
			continue
		}
		_ = p.Signal(syscall.SIGTERM)
		if _, err := p.Wait(5 * time.Second); err != nil {
			p.Kill()
		}
	}
	for _, d := range frrDaemons {
		_ = os.Remove(filepath.Join(f.runDir(), d+".vty"))
	}
	_ = os.Remove(filepath.Join(f.runDir(), "zserv.api"))
}

// Restart stops and starts the router with the same configuration.
func (f *FRR) Restart(ctx context.Context) error {
	f.Stop()
	return f.Start(ctx)
}

func (f *FRR) cleanup() {
	f.Stop()
	_ = os.RemoveAll(f.runDir())
	_ = os.RemoveAll(f.dir)
}

// Logs returns what each daemon printed, for test failure messages.
func (f *FRR) Logs() string {
	var b strings.Builder
	for _, p := range f.procs {
		state := "running"
		if p.Exited() {
			state = "exited"
		}
		fmt.Fprintf(&b, "--- %s (%s)\n%s", p.Name, state, p.Output())
	}
	return b.String()
}

// Vtysh runs vtysh commands against this router and returns the output.
func (f *FRR) Vtysh(ctx context.Context, cmds ...string) ([]byte, error) {
	args := []string{"-N", f.Pathspace}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, "vtysh", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("vtysh -N %s %q: %w: %s", f.Pathspace, cmds, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// BGPNextHops returns the next hops bgpd has for prefix (from
// `show ip bgp json` / `show bgp ipv6 json`), sorted; empty when the
// prefix is not in the BGP table.
func (f *FRR) BGPNextHops(ctx context.Context, prefix netip.Prefix) ([]netip.Addr, error) {
	cmd := "show ip bgp json"
	if prefix.Addr().Is6() {
		cmd = "show bgp ipv6 unicast json"
	}
	out, err := f.Vtysh(ctx, cmd)
	if err != nil {
		return nil, err
	}
	var table struct {
		Routes map[string][]struct {
			Valid    bool `json:"valid"`
			Nexthops []struct {
				IP    string `json:"ip"`
				Scope string `json:"scope"`
			} `json:"nexthops"`
		} `json:"routes"`
	}
	if err := json.Unmarshal(out, &table); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", cmd, err, out)
	}
	var hops []netip.Addr
	for _, path := range table.Routes[prefix.String()] {
		if !path.Valid {
			continue
		}
		for _, nh := range path.Nexthops {
			if nh.Scope == "link-local" {
				continue
			}
			if a, err := netip.ParseAddr(nh.IP); err == nil {
				hops = append(hops, a)
			}
		}
	}
	sort.Slice(hops, func(i, j int) bool { return hops[i].Less(hops[j]) })
	return hops, nil
}

// BFDPeer is one entry of `show bfd peers json`.
type BFDPeer struct {
	Multihop               bool   `json:"multihop"`
	MinimumTTL             int    `json:"minimum-ttl"`
	Peer                   string `json:"peer"`
	Local                  string `json:"local"`
	Interface              string `json:"interface"`
	ID                     uint32 `json:"id"`
	RemoteID               uint32 `json:"remote-id"`
	Status                 string `json:"status"`
	Diagnostic             string `json:"diagnostic"`
	RemoteDiagnostic       string `json:"remote-diagnostic"`
	DetectMultiplier       int    `json:"detect-multiplier"`
	ReceiveInterval        int    `json:"receive-interval"`  // ms, local
	TransmitInterval       int    `json:"transmit-interval"` // ms, local
	RemoteDetectMultiplier int    `json:"remote-detect-multiplier"`
	RemoteReceiveInterval  int    `json:"remote-receive-interval"`
	RemoteTransmitInterval int    `json:"remote-transmit-interval"`
	Uptime                 int    `json:"uptime"`
	Downtime               int    `json:"downtime"`
}

// BFDPeers returns `show bfd peers json`.
func (f *FRR) BFDPeers(ctx context.Context) ([]BFDPeer, error) {
	out, err := f.Vtysh(ctx, "show bfd peers json")
	if err != nil {
		return nil, err
	}
	var peers []BFDPeer
	if err := json.Unmarshal(out, &peers); err != nil {
		return nil, fmt.Errorf("show bfd peers json: %w: %s", err, out)
	}
	return peers, nil
}

// KernelNextHops returns the next hops of the router's kernel route to
// prefix (`ip route show <prefix>`: one "via" or several "nexthop via"),
// sorted; empty when there is no such route.
func (h *Host) KernelNextHops(ctx context.Context, prefix netip.Prefix) ([]netip.Addr, error) {
	fam := "-4"
	if prefix.Addr().Is6() {
		fam = "-6"
	}
	out, err := h.Output(ctx, "ip", fam, "route", "show", prefix.String())
	if err != nil {
		return nil, err
	}
	return parseNextHops(string(out)), nil
}

func parseNextHops(out string) []netip.Addr {
	var hops []netip.Addr
	f := strings.Fields(out)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "via" {
			if a, err := netip.ParseAddr(f[i+1]); err == nil {
				hops = append(hops, a)
			}
		}
	}
	sort.Slice(hops, func(i, j int) bool { return hops[i].Less(hops[j]) })
	return hops
}

// BGPRouter describes the usual lab router: one BGP AS accepting dynamic
// eBGP neighbours from the lab subnets (FRR is passive for those; vipd
// dials), ECMP over all of them, optional MD5 and BFD.
type BGPRouter struct {
	AS       uint32
	RouterID netip.Addr
	// Ranges are the subnets neighbours may come from (bgp listen range).
	Ranges    []netip.Prefix
	Password  string // MD5 for every neighbour; empty: none
	Keepalive int    // seconds; 0: 3
	Hold      int    // seconds; 0: 9
	// BFD enables BFD on every neighbour with this profile (nil: off).
	BFD *BFDProfile
	// IBGP makes the neighbours internal (nodes in the router's AS), with
	// iBGP multipath; otherwise they are external.
	IBGP bool
	// Multihop > 0 makes the neighbours eBGP multihop with this TTL; their
	// BFD sessions are then multihop too (RFC 5883, UDP 4784).
	Multihop int
	// Debug turns on bgp neighbour/update and bfd peer debugging in the logs.
	Debug bool
	// VIPs, when set, are the only prefixes accepted from the nodes (a
	// prefix list per address family), as a production router should.
	VIPs []netip.Prefix
}

// BFDProfile is an FRR bfd profile (milliseconds).
type BFDProfile struct {
	ReceiveInterval  int
	TransmitInterval int
	DetectMultiplier int
	// MinimumTTL is the lowest TTL accepted on multihop sessions (FRR's
	// default is 254); 0 leaves it out.
	MinimumTTL int
}

var routerTmpl = template.Must(template.New("frr").Funcs(template.FuncMap{"add": func(i int) int { return 10 * (i + 1) }}).Parse(`frr defaults traditional
log stdout {{if .Debug}}debugging{{else}}informational{{end}}
log timestamp precision 6
service integrated-vtysh-config
!
{{- if .Debug}}
debug bgp neighbor-events
debug bgp updates
debug bgp bfd
debug bfd peer
debug bfd network
!
{{- end}}
router bgp {{.AS}}
 bgp router-id {{.RouterID}}
 no bgp ebgp-requires-policy
 no bgp default ipv4-unicast
 bgp bestpath as-path multipath-relax
{{- range $i, $r := .Groups}}
 neighbor {{$r.Name}} peer-group
 neighbor {{$r.Name}} remote-as {{if $.IBGP}}internal{{else}}external{{end}}
 neighbor {{$r.Name}} timers {{$.KA}} {{$.HT}}
{{- if $.Multihop}}
 neighbor {{$r.Name}} ebgp-multihop {{$.Multihop}}
{{- end}}
{{- if $.Password}}
 neighbor {{$r.Name}} password {{$.Password}}
{{- end}}
{{- if $.BFD}}
 neighbor {{$r.Name}} bfd profile vipd
{{- end}}
 bgp listen range {{$r.Range}} peer-group {{$r.Name}}
{{- end}}
{{- range .Groups}}
 !
 address-family {{.AF}} unicast
  neighbor {{.Name}} activate
{{- if .PrefixList}}
  neighbor {{.Name}} prefix-list {{.PrefixList}} in
{{- end}}
  maximum-paths 16
{{- if $.IBGP}}
  maximum-paths ibgp 16
{{- end}}
 exit-address-family
{{- end}}
exit
!
{{- range $i, $v := .VIPs4}}
ip prefix-list VIPS seq {{add $i}} permit {{$v}}
{{- end}}
{{- range $i, $v := .VIPs6}}
ipv6 prefix-list VIPS6 seq {{add $i}} permit {{$v}}
{{- end}}
{{- if or .VIPs4 .VIPs6}}
!
{{- end}}
{{- if .BFD}}
bfd
 profile vipd
  detect-multiplier {{.BFD.DetectMultiplier}}
  receive-interval {{.BFD.ReceiveInterval}}
  transmit-interval {{.BFD.TransmitInterval}}
{{- if .BFD.MinimumTTL}}
  minimum-ttl {{.BFD.MinimumTTL}}
{{- end}}
 exit
exit
!
{{- end}}
`))

// Render returns the frr.conf text.
func (r BGPRouter) Render() (string, error) {
	if r.AS == 0 || !r.RouterID.Is4() || len(r.Ranges) == 0 {
		return "", errors.New("lab: BGPRouter needs AS, an IPv4 RouterID and at least one range")
	}
	type group struct {
		Name, AF, PrefixList string
		Range                netip.Prefix
	}
	data := struct {
		BGPRouter
		KA, HT       int
		Groups       []group
		VIPs4, VIPs6 []netip.Prefix
	}{BGPRouter: r, KA: r.Keepalive, HT: r.Hold}
	for _, v := range r.VIPs {
		if v.Addr().Is4() {
			data.VIPs4 = append(data.VIPs4, v)
		} else {
			data.VIPs6 = append(data.VIPs6, v)
		}
	}
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
		g := group{Name: fmt.Sprintf("NODES%d", i), AF: af, Range: p.Masked()}
		if len(r.VIPs) > 0 {
			g.PrefixList = "VIPS"
			if af == "ipv6" {
				g.PrefixList = "VIPS6"
			}
		}
		data.Groups = append(data.Groups, g)
	}
	var b strings.Builder
	if err := routerTmpl.Execute(&b, data); err != nil {
		return "", err
	}
	return b.String(), nil
}
