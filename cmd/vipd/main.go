// Command vipd keeps a virtual IP alive on the healthy control-plane nodes
// of a bare-metal Kubernetes cluster (or any L4 service): one elected holder
// on the LAN (l2), every healthy node through BGP (bgp), or a cloud reserved
// IP moved to the elected holder (cloud).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/config"
)

// version is set at link time: -ldflags "-X main.version=...".
var version = "dev"

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitConfig  = 2 // invalid configuration or usage
)

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

func execute(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ce *config.Error
	var ue usageError
	var coded interface{ ExitCode() int }
	switch {
	case errors.As(err, &coded):
		fmt.Fprintln(stderr, "vipd: "+err.Error())
		return coded.ExitCode()
	case errors.As(err, &ce):
		fmt.Fprintln(stderr, "vipd: "+err.Error())
		return exitConfig
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "vipd: "+err.Error())
		return exitConfig
	default:
		fmt.Fprintln(stderr, "vipd: "+err.Error())
		return exitFailure
	}
}

// usageError is a bad command line or setting (exit 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "vipd",
		Short: "keep a virtual IP on the healthy nodes of a control plane",
		Long: `vipd keeps one or more virtual IPs (IPv4 and IPv6) reachable on exactly the
nodes whose local kube-apiserver is healthy, with the fastest failover that is
safe. It runs under systemd on every control-plane node, before Kubernetes
exists, so that "kubeadm init --control-plane-endpoint VIP:6443" works on the
first node.

Modes (VIPD_MODE):
  l2     one holder, elected over gossip (memberlist), binds the VIP and sends
         gratuitous ARP / unsolicited neighbour advertisements
  bgp    every healthy node advertises the VIP with embedded BGP (ECMP at the
         router), with optional BFD
  cloud  the elected holder moves a DigitalOcean reserved IP or a Hetzner
         Cloud floating IP to its instance (VIPD_CLOUD_PROVIDER)

Every setting is an environment variable (systemd reads /etc/vipd/vipd.env)
and a flag of "vipd run"; a flag wins over the environment. See "vipd run --help"
for the full list, and vipd(8).

Files:
  /etc/vipd/vipd.env          settings for the systemd unit (vipd.service)
  /var/lib/vipd/lease.state   the lease election's state (VIPD_STATE_DIR); see "vipd forget"
  /var/lib/vipd/vipd.sock     control socket of "vipd handover" and "vipd forget" (root only)
  /var/lib/vipd/vipd.lock     locked by a running vipd; "vipd cleanup" refuses while it is
  127.0.0.1:9469              /metrics, /status, /healthz (VIPD_METRICS_ADDRESS)

Exit status:
  0  stopped on request (SIGTERM/SIGINT), or the command succeeded
  1  a runtime failure (the message says which)
  2  an invalid setting, flag or input file (one line names it)`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newRunCmd(), newCheckConfigCmd(), newStatusCmd(), newVersionCmd(), newKeygenCmd(), newHandoverCmd())
	root.AddCommand(extraCommands()...)
	return root
}
