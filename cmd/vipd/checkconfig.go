package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/vip"
)

func newCheckConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check-config",
		Short: "validate the configuration and print the effective settings",
		Long: `check-config reads the settings exactly as "vipd run" would (flags over
environment over defaults), validates them and prints every effective value,
secrets redacted. An invalid value is reported as one line naming the
variable, the value and the accepted form (never a secret's value), with exit
code 2. The gossip key file (VIPD_GOSSIP_KEY_FILE) is read and checked when
gossip runs (l2 or cloud mode with VIPD_PEERS).
Nothing is bound and nothing is contacted.

--env-file reads the file exactly as systemd's EnvironmentFile= does: a "#"
or ";" starts a comment only at the start of a line (VIPD_MODE=l2 # x sets
"l2 # x"), quotes and backslashes follow systemd's rules, and lines systemd
would ignore (such as "export VIPD_X=1") are reported as warnings.

In l2 mode on a node with more than one interface, the ARP sysctls that
make every NIC answer for the VIP (arp_ignore 0) or name it in requests
from another NIC (arp_announce below 2) are reported as warnings: they
matter only there (docs/l2.md, "Nodes with more than one interface").`,
		Args: cobra.NoArgs,
	}
	v := settingsFlags(cmd.Flags())
	envFile := envFileFlag(cmd)
	settingsUsage(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := envFile(cmd.ErrOrStderr()); err != nil {
			return err
		}
		c, err := loadConfig(v)
		if err != nil {
			return err
		}
		for _, w := range warnUnknownEnv() {
			fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
		}
		for _, w := range l2HostWarnings(c) {
			fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
		}
		fmt.Fprintln(cmd.OutOrStdout(), strings.Join(c.Effective(), "\n"))
		fmt.Fprintln(cmd.OutOrStdout(), strings.Join(c.ProfileLines(), "\n"))
		return nil
	}
	return cmd
}

// l2HostWarnings checks this host for an l2 VIP: the ARP sysctls of a
// multi-homed node (arpSysctlWarnings). Nothing in other modes, or when the
// interfaces cannot be listed.
func l2HostWarnings(c *config.Config) []string {
	if c.Mode != config.ModeL2 || len(c.Addresses) == 0 && !c.Pools {
		return nil
	}
	iface := c.Interface
	if iface == "" {
		var err error
		if iface, err = vip.DefaultInterface(); err != nil {
			return nil
		}
	}
	links, err := hostLinks()
	if err != nil {
		return nil
	}
	return arpSysctlWarnings(iface, links, "/proc/sys")
}

// envFileFlag adds --env-file to cmd. The function it returns reads the
// file, if one was given, into this process's environment, as systemd's
// EnvironmentFile= would (applyEnvFile), and warns on stderr of every
// assignment systemd would ignore.
func envFileFlag(cmd *cobra.Command) func(stderr io.Writer) error {
	var path string
	cmd.Flags().StringVar(&path, "env-file", "", "read settings from this env file first, as systemd would (e.g. /etc/vipd/vipd.env); flags still win")
	return func(stderr io.Writer) error {
		if path == "" {
			return nil
		}
		ignored, err := applyEnvFile(path)
		if err != nil {
			return err
		}
		for _, w := range ignored {
			fmt.Fprintf(stderr, "warning: --env-file %s: %s\n", path, w)
		}
		return nil
	}
}

// applyEnvFile sets the variables of an env file in this process, over the
// inherited environment, exactly as systemd's EnvironmentFile= passes them
// to the unit (config.ParseEnvFile). It returns the assignments systemd
// would drop.
func applyEnvFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usageError{fmt.Errorf("--env-file: %w", err)}
	}
	f, err := config.ParseEnvFile(b)
	if err != nil {
		return nil, usageError{fmt.Errorf("--env-file %s: %w", path, err)}
	}
	for _, v := range f.Vars {
		if err := os.Setenv(v.Name, v.Value); err != nil {
			return nil, err
		}
	}
	return f.Warnings, nil
}
