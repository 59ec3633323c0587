package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vipd/vipd/lab"
)

// The contenders of the side-by-side bench: vipd in both profiles and
// keepalived (Debian's package) with its default advert interval and with
// VRRPv3's fast 100 ms adverts. Every one runs only inside the lab's node
// namespaces, on the lab bridge.
type impl struct {
	name string
	// keepalived: the VRRP advert interval (0: vipd).
	advert string
	// keepalived: the health script's fall count (its interval cannot go
	// below 1 s).
	fall int
	// vipd: the environment of the profile.
	env []string
	// apiEnv is added for the "api" scenario (vipd fast: the issue's
	// VIPD_HEALTH_INTERVAL=100ms).
	apiEnv []string
}

func (i impl) keepalived() bool { return i.advert != "" }

var impls = []impl{
	{name: "vipd-default"},
	{name: "vipd-fast", env: []string{"VIPD_PROFILE=fast"}, apiEnv: []string{"VIPD_HEALTH_INTERVAL=100ms"}},
	{name: "keepalived-default", advert: "1", fall: 3},
	{name: "keepalived-fast", advert: "0.1", fall: 1},
}

func implNames() string {
	var n []string
	for _, i := range impls {
		n = append(n, i.name)
	}
	return strings.Join(n, ",")
}

// keepalivedBinary finds keepalived (Debian package keepalived, which
// `make deps` installs).
func keepalivedBinary() (string, error) {
	p, err := exec.LookPath("keepalived")
	if err != nil {
		return "", fmt.Errorf("keepalived not found (apt-get install keepalived; make deps does): %w", err)
	}
	return p, nil
}

// keepalivedConf renders one node's configuration: VRRPv3, every node a
// BACKUP of equal priority without preemption (like vipd: the holder keeps
// the VIP), the VIP as a /32 on eth0, and the same health check vipd makes:
// the local apiserver's /livez over TLS, every second (keepalived's
// shortest script interval), fall failures to go to FAULT.
func keepalivedConf(c *cluster, n *lab.Host, i impl, vrid int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global_defs {
    router_id %s
    vrrp_version 3
    script_user root
    enable_script_security
    vrrp_garp_master_delay 5
}
vrrp_script chk_apiserver {
    script "/usr/bin/curl -sfk -o /dev/null --max-time 1 https://127.0.0.1:6443/livez"
    interval 1
    timeout 1
    rise 1
    fall %d
}
vrrp_instance VI_1 {
    state BACKUP
    nopreempt
    interface %s
    virtual_router_id %d
    priority 100
    advert_int %s
    virtual_ipaddress {
        %s/32 dev %s
    }
    track_script {
        chk_apiserver
    }
}
`, n.Name, i.fall, n.Link, vrid, i.advert, c.vip, n.Link)
	return b.String()
}

// startKeepalived starts keepalived (VRRP only, in the foreground, logging
// to its output) in n's namespace with its configuration and pid files in
// the lab's temporary directory.
func (c *cluster) startKeepalived(n *lab.Host) (*lab.Proc, error) {
	bin, err := keepalivedBinary()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(c.tmp, "keepalived-"+n.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(conf, []byte(keepalivedConf(c, n, c.impl, c.vrid)), 0o600); err != nil {
		return nil, err
	}
	return n.Start("keepalived "+n.Name, nil, bin, "--dont-fork", "--log-console", "--no-syslog", "--vrrp", "--dont-respawn",
		"--use-file", conf, "--pid", filepath.Join(dir, "keepalived.pid"), "--vrrp_pid", filepath.Join(dir, "vrrp.pid"))
}
