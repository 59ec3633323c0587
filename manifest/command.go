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

  static-pod  a kubelet static Pod for /etc/kubernetes/manifests/vipd.yaml
  env         a commented env file for /etc/vipd/vipd.env (vipd.service)

The settings are validated as "vipd run" would validate them.`,
		Args: cobra.NoArgs,
	}

	var opts PodOptions
	pod := &cobra.Command{
		Use:   "static-pod",
		Short: "print a kubelet static-pod manifest running vipd",
		Long: `static-pod prints a Pod for the kubelet's static-pod directory: host network,
the capabilities NET_ADMIN, NET_RAW and NET_BIND_SERVICE only, the settings as
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
	cmd.AddCommand(pod, env)
	return cmd
}
