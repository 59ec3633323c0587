package migrate

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// InputError is an unreadable or invalid input file. Its ExitCode is 2, the
// exit status of `vipd migrate` for bad input.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// ExitCode is the process exit status for this error.
func (e *InputError) ExitCode() int { return 2 }

// Command returns the `migrate` command with its `kube-vip` and `novaedge`
// subcommands. The caller adds it to the root command; errors of bad input
// are *InputError (exit status 2).
func Command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "translate a kube-vip or NovaEdge configuration into a vipd env file, or MetalLB pools into IPPools",
		Long: `migrate reads another VIP daemon's configuration and prints the equivalent
vipd env file (for /etc/vipd/vipd.env) on standard output, or into -o FILE.
Warnings (settings that did nothing, changed meaning, or belong to features
vipd does not have) go to standard error; read them before using the file.
Nothing is contacted: the translation only reads the input.

Exit status: 0 (with or without warnings), 2 when the input cannot be read or
parsed (the message names the line).`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(
		subcommand("kube-vip FILE|-", "from a kube-vip static pod, DaemonSet or env list", `Reads a kube-vip static-pod manifest, a DaemonSet manifest (a multi-document
file with RBAC objects is fine) or a plain NAME=VALUE list, "-" for standard
input. kube-vip flags in the container's args are read too (env wins, as in
kube-vip).`, KubeVIP),
		subcommand("novaedge FILE|-", "from a NovaEdge control-plane VIP env file, systemd unit or static pod", `Reads a NovaEdge env file (NOVAEDGE_CP_VIP_*, NOVAEDGE_BGP_*, NOVAEDGE_BFD_*),
the systemd unit or static pod "novactl generate" writes (the agent's
--cp-vip-* flags), or a Pod/DaemonSet manifest carrying those variables, "-"
for standard input.`, NovaEdge),
		metalLBCommand(),
	)
	return cmd
}

// metalLBCommand is `vipd migrate metallb`: MetalLB pools and
// advertisements in, vipd IPPool objects out (YAML for kubectl apply).
func metalLBCommand() *cobra.Command {
	return translate("metallb FILE|-", "from MetalLB IPAddressPool, L2Advertisement and BGPAdvertisement objects to vipd IPPools",
		`Reads MetalLB's metallb.io objects (a multi-document YAML file, or the output
of kubectl get ipaddresspools,l2advertisements,bgpadvertisements -A -o yaml),
"-" for standard input, and prints the equivalent vipd IPPool objects as YAML
for kubectl apply. Pool addresses, autoAssign, avoidBuggyIPs and
serviceAllocation carry over; the mode and node selector come from the
advertisements that select each pool. What has no vipd equivalent is a
warning on standard error.`,
		"write the YAML to this path instead of standard output", MetalLB, PoolsResult.WriteYAML)
}

// subcommand is a translation into a vipd env file.
func subcommand(use, short, long string, fn func(io.Reader) (Result, error)) *cobra.Command {
	return translate(use, short, long, "write the env file to this path (mode 0640) instead of standard output", fn, Result.WriteEnv)
}

// translate is a subcommand reading FILE or "-" through fn, printing its
// warnings on standard error and writing the result with write to
// standard output or -o (atomically).
func translate[R interface{ WriteWarnings(io.Writer) error }](use, short, long, outHelp string, fn func(io.Reader) (R, error), write func(R, io.Writer) error) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var in io.Reader = cmd.InOrStdin()
			name := "standard input"
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return &InputError{Err: err}
				}
				defer f.Close()
				in, name = f, args[0]
			}
			res, err := fn(in)
			if err != nil {
				return &InputError{Err: fmt.Errorf("%s: %w", name, err)}
			}
			if err := res.WriteWarnings(cmd.ErrOrStderr()); err != nil {
				return err
			}
			if out == "" || out == "-" {
				return write(res, cmd.OutOrStdout())
			}
			var buf bytes.Buffer
			if err := write(res, &buf); err != nil {
				return err
			}
			return writeFileAtomic(out, buf.Bytes())
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", outHelp)
	return cmd
}

// writeFileAtomic writes data to path through a temporary file in the
// same directory, so a reader never sees half a file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".vipd-migrate-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o640); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
