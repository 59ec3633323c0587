package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/subosito/gotenv"
)

func newCheckConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check-config",
		Short: "validate the configuration and print the effective settings",
		Long: `check-config reads the settings exactly as "vipd run" would (flags over
environment over defaults), validates them and prints every effective value,
secrets redacted. An invalid value is reported as one line naming the
variable, the value and the accepted form, with exit code 2. Nothing is bound
and nothing is contacted.`,
		Args: cobra.NoArgs,
	}
	v := settingsFlags(cmd.Flags())
	var envFile string
	cmd.Flags().StringVar(&envFile, "env-file", "", "read settings from this env file first, as systemd would (e.g. /etc/vipd/vipd.env); flags still win")
	settingsUsage(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if envFile != "" {
			if err := applyEnvFile(envFile); err != nil {
				return err
			}
		}
		c, err := loadConfig(v)
		if err != nil {
			return err
		}
		for _, w := range warnUnknownEnv() {
			fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
		}
		fmt.Fprintln(cmd.OutOrStdout(), strings.Join(c.Effective(), "\n"))
		return nil
	}
	return cmd
}

// applyEnvFile sets the variables of an env file in this process, over the
// inherited environment, as systemd's EnvironmentFile= would for the unit.
func applyEnvFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return usageError{fmt.Errorf("--env-file: %w", err)}
	}
	defer f.Close()
	env, err := gotenv.StrictParse(f)
	if err != nil {
		return usageError{fmt.Errorf("--env-file %s: %w", path, err)}
	}
	for k, val := range env {
		if err := os.Setenv(k, val); err != nil {
			return err
		}
	}
	return nil
}
