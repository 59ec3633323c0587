package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
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
	settingsUsage(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
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
