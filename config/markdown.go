package config

import (
	"fmt"
	"io"
	"strings"
)

// WriteMarkdown writes the settings as the tables of docs/configuration.md.
func WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString("# Configuration\n\n")
	b.WriteString("Every setting is an environment variable (systemd reads them from `/etc/vipd/vipd.env`) and a flag of `vipd run`; a flag that is given wins over the environment, which wins over the default. An invalid value stops vipd with exit code 2 and one line naming the variable, the value and the accepted form; `vipd check-config` validates and prints the effective values (secrets redacted) without starting anything.\n\n")
	b.WriteString("This file is generated from the settings table in `config/settings.go` (`UPDATE=1 go test ./config` rewrites it).\n")
	section := ""
	for _, s := range table {
		if s.Section != section {
			section = s.Section
			fmt.Fprintf(&b, "\n## %s\n\n| variable | flag | default | meaning | accepted |\n|---|---|---|---|---|\n", section)
		}
		def := s.Default
		if def == "" {
			def = "-"
		} else {
			def = "`" + def + "`"
		}
		secret := ""
		if s.Secret {
			secret = " (secret: redacted in output)"
		}
		fmt.Fprintf(&b, "| `%s` | `--%s` | %s | %s%s | %s |\n", s.Env, s.Flag, def, strings.ReplaceAll(s.Doc, "|", "\\|"), secret, strings.ReplaceAll(s.Accepted, "|", "\\|"))
	}
	profileMarkdown(&b)
	_, err := io.WriteString(w, b.String())
	return err
}
