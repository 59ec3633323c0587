package manifest

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vipd/vipd/config"
)

// SettingsFlags adds one flag per setting to a flag set and returns the
// config.Source that resolves them the way `vipd run` does (a given flag
// wins over the environment). cmd/vipd supplies it, so both manifest
// commands accept exactly the flags of `vipd run`.
type SettingsFlags func(fs *pflag.FlagSet) config.Source

// Command returns the `manifest` command with `static-pod` and `env`
// subcommands. version is vipd's version (the default image tag); flags
// adds the settings' flags.
func Command(version string, flags SettingsFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "manifest",
		Short: "print a static-pod manifest or an env file for the given settings",
		Long: `manifest prints vipd's configuration, given with the same flags (or environment
variables) as "vipd run", in a deployable form:

  static-pod             a kubelet static Pod for /etc/kubernetes/manifests/vipd.yaml
  env                    a commented env file for /etc/vipd/vipd.env (vipd.service)
  kubeadm-control-plane  a Cluster API KubeadmControlPlane whose machines run vipd

The settings are validated as "vipd run" would validate them.`,
		Args: cobra.NoArgs,
	}

	var opts PodOptions
	pod := &cobra.Command{
		Use:   "static-pod",
		Short: "print a kubelet static-pod manifest running vipd",
		Long: `static-pod prints a Pod for the kubelet's static-pod directory: host network,
the capabilities NET_ADMIN, NET_RAW and NET_BIND_SERVICE only (and IPC_LOCK
when the settings lock vipd's memory: VIPD_MEMORY_LOCK=on, VIPD_PROFILE=fast),
the settings as
environment variables, the state directory and any configured files (CA, gossip
key, token) mounted from the host. VIPD_NODE_NAME defaults to the Pod's
spec.nodeName. Tokens given as settings are refused (they would be visible in
the mirror Pod): use the *_FILE settings.`,
		Args: cobra.NoArgs,
	}
	podSrc := flags(pod.Flags())
	pod.Flags().StringVar(&opts.Image, "image", "", "container image (default "+DefaultImageRepo+":<version>)")
	pod.Flags().StringVar(&opts.Name, "pod-name", "vipd", "name of the Pod")
	pod.Flags().StringVar(&opts.Namespace, "pod-namespace", "kube-system", "namespace of the Pod")
	pod.RunE = func(cmd *cobra.Command, _ []string) error {
		vars := Given(podSrc)
		if _, err := Validate(vars); err != nil {
			return err
		}
		opts.Version = version
		p, err := StaticPod(vars, opts)
		if err != nil {
			return err
		}
		return WritePod(cmd.OutOrStdout(), p)
	}

	env := &cobra.Command{
		Use:   "env",
		Short: "print a commented env file for /etc/vipd/vipd.env",
		Long: `env prints every setting with its documentation: the settings given (flags or
environment) as active lines, all others as commented-out defaults. With no
settings given it prints the default file the package installs. Given settings
are validated as "vipd run" would validate them.`,
		Args: cobra.NoArgs,
	}
	envSrc := flags(env.Flags())
	env.RunE = func(cmd *cobra.Command, _ []string) error {
		vars := Given(envSrc)
		if len(vars) > 0 {
			if _, err := Validate(vars); err != nil {
				return err
			}
		}
		return WriteEnv(cmd.OutOrStdout(), vars)
	}
	cmd.AddCommand(pod, env, kcpCommand(flags))
	return cmd
}

func kcpCommand(flags SettingsFlags) *cobra.Command {
	var opts KCPOptions
	kcp := &cobra.Command{
		Use:   "kubeadm-control-plane",
		Short: "print a Cluster API KubeadmControlPlane whose machines run vipd",
		Long: `kubeadm-control-plane prints a KubeadmControlPlane (controlplane.cluster.x-k8s.io/v1beta1)
that puts vipd on every control-plane machine, under systemd, before kubeadm init or join:

  files               /etc/vipd/vipd.env with the settings given here, and the gossip key
                      from a Secret (--gossip-key-secret) at /etc/vipd/gossip.key
  preKubeadmCommands  install the package (--package-url; without it vipd must be in the
                      machine image), vipd check-config, start vipd.service
  controlPlaneEndpoint  the VIP (the first IPv4 address of --address), also a certificate SAN

The settings take the same flags as "vipd run" and are validated the same way.
Secrets given as settings are refused (the object is readable in the management
cluster): use the *_FILE settings.`,
		Example: `  vipd keygen --out gossip.key
  kubectl create secret generic c1-vipd-gossip --from-file=gossip.key
  vipd manifest kubeadm-control-plane --cluster-name c1 --kubernetes-version v1.34.4 \
    --infrastructure-api-version infrastructure.cluster.x-k8s.io/v1beta1 \
    --infrastructure-kind Metal3MachineTemplate --infrastructure-name c1-controlplane \
    --package-url https://example.com/vipd_1.2.3-1_amd64.deb --gossip-key-secret c1-vipd-gossip \
    --address 192.0.2.100/32 --peers 192.0.2.11,192.0.2.12,192.0.2.13`,
		Args: cobra.NoArgs,
	}
	src := flags(kcp.Flags())
	f := kcp.Flags()
	f.StringVar(&opts.ClusterName, "cluster-name", "", "the Cluster API Cluster's name (required)")
	f.StringVar(&opts.Name, "name", "", "the KubeadmControlPlane's name (default <cluster-name>-control-plane)")
	f.StringVar(&opts.Namespace, "namespace", "default", "the namespace of the Cluster and its objects")
	f.StringVar(&opts.KubernetesVersion, "kubernetes-version", "", "spec.version, v1.Y.Z (required)")
	f.IntVar(&opts.Replicas, "replicas", 3, "control-plane machines (odd)")
	f.StringVar(&opts.InfraAPIVersion, "infrastructure-api-version", "", "apiVersion of the machine template (required)")
	f.StringVar(&opts.InfraKind, "infrastructure-kind", "", "kind of the machine template, e.g. Metal3MachineTemplate (required)")
	f.StringVar(&opts.InfraName, "infrastructure-name", "", "name of the machine template (required)")
	f.StringVar(&opts.PackageURL, "package-url", "", "URL of the vipd .deb or .rpm the machines install (empty: vipd is in the image)")
	f.StringVar(&opts.PackageSHA256, "package-sha256", "", "SHA-256 of the package, checked before installing")
	f.StringVar(&opts.GossipKeySecret, "gossip-key-secret", "", "Secret (in --namespace) holding the gossip key; required with --peers")
	f.StringVar(&opts.GossipKeySecretKey, "gossip-key-secret-key", "gossip.key", "key of the gossip key in that Secret")
	f.IntVar(&opts.APIServerPort, "api-server-port", 6443, "port of the control-plane endpoint")
	kcp.RunE = func(cmd *cobra.Command, _ []string) error {
		obj, err := KubeadmControlPlane(Given(src), opts)
		if err != nil {
			return err
		}
		return WriteKubeadmControlPlane(cmd.OutOrStdout(), obj)
	}
	return kcp
}
