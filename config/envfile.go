package config

import (
	"fmt"
	"io"
	"strings"
)

// WriteEnvFile writes a commented env file (the format of
// /etc/vipd/vipd.env) with every setting. Values from set are written as
// active lines; every other setting is a commented-out default.
func WriteEnvFile(w io.Writer, set map[string]string) error {
	var b strings.Builder
	b.WriteString("# vipd configuration: read by vipd.service (EnvironmentFile=).\n")
	b.WriteString("# Every setting is also a flag of `vipd run`; see vipd(8) and `vipd run --help`.\n")
	b.WriteString("# Check a change with: vipd check-config (it prints the effective values).\n")
	section := ""
	for _, s := range table {
		if s.Section != section {
			section = s.Section
			fmt.Fprintf(&b, "\n## %s\n", section)
		}
		fmt.Fprintf(&b, "\n# %s\n", s.Doc)
		fmt.Fprintf(&b, "# Accepted: %s.", s.Accepted)
		if s.Default != "" {
			fmt.Fprintf(&b, " Default: %s.", s.Default)
		}
		b.WriteString("\n")
		if v, ok := set[s.Env]; ok {
			fmt.Fprintf(&b, "%s=%s\n", s.Env, QuoteEnvValue(v))
		} else {
			fmt.Fprintf(&b, "#%s=%s\n", s.Env, QuoteEnvValue(s.Default))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// QuoteEnvValue returns v as it must appear after NAME= in an env file read
// by systemd (EnvironmentFile=) or a shell: unchanged when it only holds safe
// characters, otherwise double-quoted with \\, ", $ and ` escaped.
func QuoteEnvValue(v string) string {
	safe := v != ""
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.ContainsRune("_-.,:/@%+=[]", c)) {
			safe = false
			break
		}
	}
	if safe || v == "" {
		return v
	}
	// Byte by byte, so that bytes that are not UTF-8 pass through as they
	// are instead of turning into U+FFFD.
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\', '"', '$', '`':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
