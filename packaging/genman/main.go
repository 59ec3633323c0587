// Command genman writes the vipd(8) manual page in roff. The SETTINGS
// section is generated from the configuration table (config.Settings), so
// the page cannot drift from what vipd accepts; the rest is written here.
//
//	go run ./packaging/genman -version 1.2.3 -date 2026-11-22 > vipd.8
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/vipd/vipd/config"
)

func main() {
	version := flag.String("version", "dev", "version printed in the page footer")
	date := flag.String("date", "", "date printed in the page footer (YYYY-MM-DD)")
	flag.Parse()
	if err := write(os.Stdout, *version, *date); err != nil {
		fmt.Fprintln(os.Stderr, "genman:", err)
		os.Exit(1)
	}
}

// esc escapes text for roff: backslashes, and a leading dot or quote.
func esc(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}

func write(w io.Writer, version, date string) error {
	b := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	p(`.TH VIPD 8 "%s" "vipd %s" "System Administration"`, esc(date), esc(version))
	p(`.SH NAME`)
	p(`vipd \- keep a virtual IP on the healthy nodes of a Kubernetes control plane`)
	p(`.SH SYNOPSIS`)
	for _, s := range []string{
		`\fBvipd run\fR [\fIflags\fR]`,
		`\fBvipd check\-config\fR [\fIflags\fR]`,
		`\fBvipd status\fR`,
		`\fBvipd handover\fR [\fB\-\-to\fR \fINODE\fR]`,
		`\fBvipd forget\fR \fINODE\fR`,
		`\fBvipd cleanup\fR [\fIflags\fR]`,
		`\fBvipd keygen\fR [\fB\-\-out\fR \fIFILE\fR]`,
		`\fBvipd manifest static\-pod\fR|\fBenv\fR|\fBkubeadm\-control\-plane\fR [\fIflags\fR]`,
		`\fBvipd migrate kube\-vip\fR|\fBnovaedge\fR \fIFILE\fR|\fB\-\fR [\fB\-o\fR \fIFILE\fR]`,
		`\fBvipd version\fR`,
		`\fBvipd completion bash\fR|\fBzsh\fR`,
	} {
		p(`.br`)
		p(`%s`, s)
	}
	p(`.SH DESCRIPTION`)
	p(`\fBvipd\fR keeps one or more virtual IP addresses (IPv4 and IPv6) reachable on exactly the nodes whose local kube\-apiserver is healthy.`)
	p(`It runs under systemd on every control\-plane node, before Kubernetes exists, so that`)
	p(`\fBkubeadm init \-\-control\-plane\-endpoint\fR \fIVIP\fR\fB:6443\fR works on the first node.`)
	p(`It needs no Kubernetes API access to decide who holds the VIP.`)
	p(`.PP`)
	p(`Modes (\fBVIPD_MODE\fR):`)
	p(`.TP`)
	p(`.B l2`)
	p(`One holder, elected over gossip among the nodes listed in \fBVIPD_PEERS\fR, binds the VIP on the interface and sends gratuitous ARP and unsolicited neighbour advertisements.`)
	p(`.TP`)
	p(`.B bgp`)
	p(`Every healthy node advertises the VIP to its BGP peers (ECMP at the router), optionally with BFD.`)
	p(`.TP`)
	p(`.B cloud`)
	p(`The elected holder moves a DigitalOcean reserved IP or a Hetzner Cloud floating IP (\fBVIPD_CLOUD_PROVIDER\fR) to its instance.`)
	p(`.PP`)
	p(`On SIGTERM (\fBsystemctl stop vipd\fR) vipd releases the VIP, leaves the gossip cluster and withdraws its routes within a second, so a planned handover costs well under a second.`)
	p(`.SH COMMANDS`)
	for _, c := range [][2]string{
		{"run", "Run the daemon. With \\fBType=notify\\fR it reports readiness to systemd once the configuration is valid and the first health check has run."},
		{"check-config", "Validate the settings exactly as \\fBrun\\fR would and print every effective value, secrets redacted. Exit status 2 on an invalid value, with one line naming the variable, the value and the accepted form."},
		{"status", "Show the running daemon's VIPs, health and cluster members, read from its \\fB/status\\fR endpoint on \\fBVIPD_METRICS_ADDRESS\\fR."},
		{"handover", "Move the VIPs this node holds to another node now (\\fB\\-\\-to\\fR \\fINODE\\fR, or the best successor): a planned, make\\-before\\-break transfer through the running daemon's control socket."},
		{"forget NODE", "Remove a node from the lease election's voters for good: a configuration change agreed by a majority, run once on any node where vipd runs. Dead voters are also removed by themselves while a majority remains."},
		{"cleanup", "Remove what a vipd that is not running left in the kernel: the configured VIPs, in l2 mode every IPv4 address with vipd's label and the egress rules. vipd.service runs it through vipd\\-cleanup.service (\\fBOnFailure=\\fR) when the unit fails for good. Refuses while vipd runs."},
		{"keygen", "Write a new gossip encryption key for \\fBVIPD_GOSSIP_KEY_FILE\\fR."},
		{"manifest static-pod", "Print a kubelet static Pod running vipd with the given settings (flags as for \\fBrun\\fR; \\fB\\-\\-image\\fR chooses the image)."},
		{"manifest env", "Print a commented env file with the given settings active and every other setting as a commented default."},
		{"manifest kubeadm-control-plane", "Print a Cluster API KubeadmControlPlane whose machines install and start vipd before \\fBkubeadm init\\fR or \\fBjoin\\fR, with the given settings in /etc/vipd/vipd.env, the gossip key from a Secret and the VIP as the control\\-plane endpoint."},
		{"migrate kube-vip FILE", "Translate a kube\\-vip static\\-pod manifest, DaemonSet or env list into a vipd env file on standard output (or \\fB\\-o\\fR \\fIFILE\\fR); warnings go to standard error. Exit status 2 on unreadable input."},
		{"migrate novaedge FILE", "The same for a NovaEdge control\\-plane VIP env file, systemd unit or static pod."},
		{"version", "Print the version."},
	} {
		p(`.TP`)
		p(`.B %s`, esc(c[0]))
		p(`%s`, c[1])
	}
	p(`.SH SETTINGS`)
	p(`Every setting is an environment variable (systemd reads \fI/etc/vipd/vipd.env\fR) and a flag of \fBvipd run\fR; a given flag wins over the environment.`)
	section := ""
	for _, s := range config.Settings() {
		if s.Section != section {
			section = s.Section
			p(`.SS %s`, esc(section))
		}
		p(`.TP`)
		p(`\fB%s\fR, \fB\-\-%s\fR`, esc(s.Env), esc(s.Flag))
		doc := esc(s.Doc) + " Accepted: " + esc(s.Accepted) + "."
		if s.Default != "" {
			doc += " Default: \\fB" + esc(s.Default) + "\\fR."
		}
		p(`%s`, doc)
	}
	p(`.SH FILES`)
	for _, f := range [][2]string{
		{"/etc/vipd/vipd.env", "Settings read by vipd.service. A configuration file of the package, kept on upgrade."},
		{"/var/lib/vipd", "State directory: the lease election's state (lease.state), the control socket (vipd.sock) and the run lock (vipd.lock). Removed on purge."},
		{"/lib/systemd/system/vipd.service", "The systemd unit. Override settings with \\fBsystemctl edit vipd\\fR."},
		{"/lib/systemd/system/vipd-cleanup.service", "Runs \\fBvipd cleanup\\fR when vipd.service fails for good (its \\fBOnFailure=\\fR); never enabled on its own."},
	} {
		p(`.TP`)
		p(`.I %s`, f[0])
		p(`%s`, f[1])
	}
	p(`.SH EXIT STATUS`)
	p(`0 on success, 1 on a runtime failure, 2 on an invalid configuration or command line (systemd does not restart vipd after exit status 2).`)
	p(`.SH EXAMPLES`)
	p(`First control\-plane node, before \fBkubeadm init\fR:`)
	p(`.PP`)
	p(`.nf`)
	p(`.RS`)
	p(`echo VIPD_ADDRESS=192.0.2.100/32 >> /etc/vipd/vipd.env`)
	p(`vipd check\-config && systemctl enable \-\-now vipd`)
	p(`kubeadm init \-\-control\-plane\-endpoint 192.0.2.100:6443 \-\-upload\-certs`)
	p(`.RE`)
	p(`.fi`)
	p(`.PP`)
	p(`Switch from kube\-vip:`)
	p(`.PP`)
	p(`.nf`)
	p(`.RS`)
	p(`vipd migrate kube\-vip /etc/kubernetes/manifests/kube\-vip.yaml \-o /etc/vipd/vipd.env`)
	p(`.RE`)
	p(`.fi`)
	p(`.SH SEE ALSO`)
	p(`\fBsystemctl\fR(1), \fBsystemd.exec\fR(5), \fBkubeadm\fR(1)`)
	return b.Flush()
}
