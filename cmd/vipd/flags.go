package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"github.com/vipd/vipd/config"
)

// settingsFlags adds one flag per setting to fs and returns the viper that
// resolves them: a flag that was given wins, then the environment, then the
// table's default.
func settingsFlags(fs *pflag.FlagSet) *viper.Viper {
	v := viper.New()
	v.AllowEmptyEnv(true)
	for _, s := range config.Settings() {
		usage := s.Doc + " [env " + s.Env
		if s.Default != "" {
			usage += ", default " + s.Default
		}
		usage += "]"
		fs.String(s.Flag, "", usage)
		_ = v.BindEnv(s.Env, s.Env)
		_ = v.BindPFlag(s.Env, fs.Lookup(s.Flag))
	}
	return v
}

// loadConfig resolves every setting through v and validates the result,
// including the settings other packages parse (BGP peers), so that
// check-config and run fail the same way.
func loadConfig(v *viper.Viper) (*config.Config, error) {
	c, err := loadSettings(v)
	if err != nil {
		return nil, err
	}
	if usesGossip(c) {
		if err := c.ReadGossipKeys(); err != nil {
			return nil, usageError{err}
		}
	}
	return c, nil
}

// loadSettings is loadConfig without reading the gossip key files: for
// commands that never join the cluster (vipd cleanup).
func loadSettings(v *viper.Viper) (*config.Config, error) {
	c, err := config.Load(func(s *config.Setting) (string, bool) {
		if !v.IsSet(s.Env) {
			return "", false
		}
		return v.GetString(s.Env), true
	})
	if err != nil {
		return nil, err
	}
	if err := checkModeSettings(c); err != nil {
		return nil, err
	}
	return c, nil
}

// warnUnknownEnv reports VIPD_* variables that are not settings.
func warnUnknownEnv() []string {
	var warnings []string
	for _, k := range config.Unknown(os.Environ()) {
		warnings = append(warnings, fmt.Sprintf("unknown setting %s ignored (a typo?)", k))
	}
	return warnings
}

// settingsHelp renders the settings table for --help, grouped by section.
func settingsHelp() string {
	var b strings.Builder
	section := ""
	for _, s := range config.Settings() {
		if s.Section != section {
			section = s.Section
			fmt.Fprintf(&b, "\n%s:\n", section)
		}
		def := ""
		if s.Default != "" {
			def = " (default " + s.Default + ")"
		}
		fmt.Fprintf(&b, "  --%s, %s%s\n      %s\n", s.Flag, s.Env, def, s.Doc)
	}
	return b.String()
}

// settingsUsage replaces the generated flag list of commands that take the
// settings with the grouped table.
func settingsUsage(cmd *cobra.Command) {
	cmd.SetUsageTemplate(`Usage:
  {{.UseLine}}

Settings (flag, environment variable):` + settingsHelp() + `{{if .HasAvailableLocalFlags}}
All flags:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}
`)
}
