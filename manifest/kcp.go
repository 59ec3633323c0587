package manifest

import (
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/vipd/vipd/config"
	"sigs.k8s.io/yaml"
)

// KCPOptions are the KubeadmControlPlane's own knobs (not vipd settings).
type KCPOptions struct {
	// ClusterName names the Cluster API Cluster; the object is
	// <ClusterName>-control-plane unless Name is set.
	ClusterName string
	Name        string
	Namespace   string
	// KubernetesVersion is spec.version, v1.Y.Z.
	KubernetesVersion string
	Replicas          int
	// The machine template's infrastructure object.
	InfraAPIVersion string
	InfraKind       string
	InfraName       string
	// PackageURL is a vipd .deb or .rpm the machines download and install
	// before kubeadm; empty: vipd is already in the machine image.
	PackageURL    string
	PackageSHA256 string
	// GossipKeySecret is a Secret in Namespace holding the gossip key under
	// GossipKeySecretKey; Cluster API writes it to the machines.
	GossipKeySecret    string
	GossipKeySecretKey string
	// APIServerPort is the port of the endpoint (6443).
	APIServerPort int
}

const (
	envFilePath       = "/etc/vipd/vipd.env"
	defaultGossipPath = "/etc/vipd/gossip.key"
	packagePath       = "/var/tmp/vipd-package"
)

var (
	kubeVersionRE = regexp.MustCompile(`^v1\.\d+\.\d+$`)
	sha256RE      = regexp.MustCompile(`^[0-9a-f]{64}$`)
	dnsLabelRE    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

func flagErr(name, value, accepted string) error {
	return &config.Error{Name: "--" + name, Value: value, Accepted: accepted}
}

// check validates the options; the first bad one is reported.
func (o *KCPOptions) check() error {
	for _, f := range []struct{ flag, v string }{
		{"cluster-name", o.ClusterName}, {"namespace", o.Namespace},
		{"infrastructure-name", o.InfraName},
	} {
		if len(f.v) > 63 || !dnsLabelRE.MatchString(f.v) {
			return flagErr(f.flag, f.v, "a Kubernetes object name (lower-case letters, digits, '-' and '.', at most 63 characters)")
		}
	}
	if o.Name != "" && (len(o.Name) > 63 || !dnsLabelRE.MatchString(o.Name)) {
		return flagErr("name", o.Name, "a Kubernetes object name (lower-case letters, digits, '-' and '.', at most 63 characters)")
	}
	if !kubeVersionRE.MatchString(o.KubernetesVersion) {
		return flagErr("kubernetes-version", o.KubernetesVersion, "a Kubernetes release as v1.Y.Z, e.g. v1.34.4")
	}
	if o.Replicas < 1 || o.Replicas%2 == 0 {
		return flagErr("replicas", strconv.Itoa(o.Replicas), "an odd number of control-plane machines, 1, 3, 5... (stacked etcd and vipd's quorum need a majority)")
	}
	if o.InfraKind == "" || !strings.Contains(o.InfraAPIVersion, "/") {
		return flagErr("infrastructure-kind", o.InfraAPIVersion+" "+o.InfraKind,
			"the machine template of your infrastructure provider: --infrastructure-api-version GROUP/VERSION --infrastructure-kind KIND (e.g. infrastructure.cluster.x-k8s.io/v1beta1 Metal3MachineTemplate)")
	}
	if o.PackageURL != "" && !strings.HasPrefix(o.PackageURL, "https://") && !strings.HasPrefix(o.PackageURL, "http://") {
		return flagErr("package-url", o.PackageURL, "an http(s) URL of a vipd .deb or .rpm, or empty when vipd is in the machine image")
	}
	if o.PackageURL != "" && !strings.HasSuffix(o.PackageURL, ".deb") && !strings.HasSuffix(o.PackageURL, ".rpm") {
		return flagErr("package-url", o.PackageURL, "a URL ending in .deb or .rpm (make package builds both)")
	}
	if o.PackageSHA256 != "" && (o.PackageURL == "" || !sha256RE.MatchString(o.PackageSHA256)) {
		return flagErr("package-sha256", o.PackageSHA256, "the package's SHA-256 as 64 lower-case hex digits, with --package-url")
	}
	if o.GossipKeySecret != "" && (len(o.GossipKeySecret) > 253 || !dnsLabelRE.MatchString(o.GossipKeySecret)) {
		return flagErr("gossip-key-secret", o.GossipKeySecret, "the name of a Secret in the KubeadmControlPlane's namespace")
	}
	if o.APIServerPort < 1 || o.APIServerPort > 65535 {
		return flagErr("api-server-port", strconv.Itoa(o.APIServerPort), "a TCP port 1-65535")
	}
	return nil
}

// endpoint is the control-plane endpoint: the first IPv4 VIP, else the
// first VIP.
func endpoint(cfg *config.Config) (netip.Addr, bool) {
	var first netip.Addr
	for _, p := range cfg.Addresses {
		if p.Addr().Is4() {
			return p.Addr(), true
		}
		if !first.IsValid() {
			first = p.Addr()
		}
	}
	return first, first.IsValid()
}

// KubeadmControlPlane builds a Cluster API KubeadmControlPlane (v1beta1)
// whose machines run vipd under systemd before kubeadm init or join: the
// settings in /etc/vipd/vipd.env, the gossip key from a Secret, vipd from
// a package (or the machine image), the unit started in
// preKubeadmCommands, and the VIP as the control-plane endpoint.
func KubeadmControlPlane(vars []Var, opts KCPOptions) (map[string]any, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	// The Secret's key goes to VIPD_GOSSIP_KEY_FILE, /etc/vipd/gossip.key
	// unless another path is given.
	keyPath := ""
	if opts.GossipKeySecret != "" {
		for _, v := range vars {
			if v.Name == "VIPD_GOSSIP_KEY_FILE" {
				keyPath = v.Value
			}
		}
		if keyPath == "" {
			keyPath = defaultGossipPath
			vars = append(vars, Var{Name: "VIPD_GOSSIP_KEY_FILE", Value: keyPath})
		}
	}
	cfg, err := Validate(vars)
	if err != nil {
		return nil, err
	}
	vip, ok := endpoint(cfg)
	if !ok {
		return nil, &config.Error{Name: "VIPD_ADDRESS", Value: "", Accepted: "the control-plane VIP (--address), which becomes the controlPlaneEndpoint"}
	}
	for _, v := range vars {
		if v.Name == "VIPD_NODE_NAME" {
			return nil, &config.Error{Name: "VIPD_NODE_NAME", Value: v.Value, Accepted: "unset: every machine uses its own host name"}
		}
		if s, ok := settingByEnv(v.Name); ok && s.Secret {
			return nil, &config.Error{Name: v.Name, Secret: true, Accepted: "unset: a KubeadmControlPlane is readable by everyone who can read the cluster's objects; put secrets in files (the *_FILE settings) written from a Secret"}
		}
	}
	if len(cfg.Peers) > 0 && opts.GossipKeySecret == "" && !cfg.GossipInsecure {
		return nil, flagErr("gossip-key-secret", "", "the Secret holding the gossip key (`vipd keygen`), required with --peers: every machine needs the same key")
	}

	var env strings.Builder
	env.WriteString("# Written by Cluster API from `vipd manifest kubeadm-control-plane`.\n")
	for _, v := range vars {
		fmt.Fprintf(&env, "%s=%s\n", v.Name, config.QuoteEnvValue(v.Value))
	}
	files := []any{map[string]any{
		"path": envFilePath, "owner": "root:root", "permissions": "0640", "content": env.String(),
	}}
	if opts.GossipKeySecret != "" {
		files = append(files, map[string]any{
			"path": keyPath, "owner": "root:root", "permissions": "0600",
			"contentFrom": map[string]any{"secret": map[string]any{"name": opts.GossipKeySecret, "key": opts.GossipKeySecretKey}},
		})
	}
	var cmds []any
	if u := opts.PackageURL; u != "" {
		ext := u[strings.LastIndex(u, "."):]
		pkg := packagePath + ext
		cmds = append(cmds, fmt.Sprintf("curl -fsSL --retry 5 -o %s %s", pkg, shellQuote(u)))
		if opts.PackageSHA256 != "" {
			cmds = append(cmds, fmt.Sprintf("echo '%s  %s' | sha256sum -c -", opts.PackageSHA256, pkg))
		}
		if ext == ".deb" {
			// --force-confold: keep the vipd.env written above.
			cmds = append(cmds, "DEBIAN_FRONTEND=noninteractive apt-get install -y -o Dpkg::Options::=--force-confold "+pkg)
		} else {
			cmds = append(cmds, "dnf install -y "+pkg)
		}
	}
	cmds = append(cmds,
		"vipd check-config --env-file "+envFilePath,
		"systemctl enable vipd",
		// Started (or restarted with the settings above) before kubeadm:
		// it binds the VIP once the local apiserver answers.
		"systemctl restart vipd",
	)

	host := vip.String()
	port := opts.APIServerPort
	name := opts.Name
	if name == "" {
		name = opts.ClusterName + "-control-plane"
	}
	kcp := map[string]any{
		"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
		"kind":       "KubeadmControlPlane",
		"metadata": map[string]any{
			"name": name, "namespace": opts.Namespace,
			"labels": map[string]any{"cluster.x-k8s.io/cluster-name": opts.ClusterName},
		},
		"spec": map[string]any{
			"replicas": int64(opts.Replicas),
			"version":  opts.KubernetesVersion,
			"machineTemplate": map[string]any{
				"infrastructureRef": map[string]any{
					"apiVersion": opts.InfraAPIVersion, "kind": opts.InfraKind,
					"name": opts.InfraName, "namespace": opts.Namespace,
				},
			},
			"kubeadmConfigSpec": map[string]any{
				"clusterConfiguration": map[string]any{
					"controlPlaneEndpoint": netip.AddrPortFrom(vip, uint16(port)).String(),
					"apiServer":            map[string]any{"certSANs": sans(cfg, host)},
				},
				"files":              files,
				"preKubeadmCommands": cmds,
			},
		},
	}
	return kcp, nil
}

// sans are the VIPs: the endpoint first, then any other address family.
func sans(cfg *config.Config, host string) []any {
	out := []any{host}
	for _, p := range cfg.Addresses {
		if a := p.Addr().String(); a != host {
			out = append(out, a)
		}
	}
	return out
}

func settingByEnv(name string) (config.Setting, bool) {
	for _, s := range config.Settings() {
		if s.Env == name {
			return s, true
		}
	}
	return config.Setting{}, false
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// WriteKubeadmControlPlane writes the object as YAML with a header saying
// what else the cluster needs.
func WriteKubeadmControlPlane(w io.Writer, kcp map[string]any) error {
	b, err := yaml.Marshal(kcp)
	if err != nil {
		return fmt.Errorf("encode KubeadmControlPlane: %w", err)
	}
	spec := kcp["spec"].(map[string]any)["kubeadmConfigSpec"].(map[string]any)
	ep := spec["clusterConfiguration"].(map[string]any)["controlPlaneEndpoint"].(string)
	header := "# KubeadmControlPlane running vipd on every control-plane machine (docs/kubeadm.md, Cluster API).\n" +
		"# Generated by `vipd manifest kubeadm-control-plane`. The Cluster's (or the infrastructure\n" +
		"# cluster's) spec.controlPlaneEndpoint must be the same endpoint, " + ep + ".\n"
	if _, err := io.WriteString(w, header+string(b)); err != nil {
		return fmt.Errorf("write KubeadmControlPlane: %w", err)
	}
	return nil
}
