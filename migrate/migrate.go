// Package migrate turns the configuration of another control-plane VIP
// daemon (kube-vip, NovaEdge) into a vipd environment file.
//
// The translation is pure: it reads a manifest or an env list, never the
// network, the host or the cluster. Every input setting ends up somewhere
// visible: as a VIPD_* variable, as a comment explaining the vipd
// equivalent, or as a warning (settings that did nothing, changed meaning,
// or belong to features vipd does not have).
package migrate

import (
	"bufio"
	"fmt"
	"github.com/vipd/vipd/config"
	"io"
	"strings"
)

// EnvLine is one entry of a generated env file: an optional comment block
// followed by an optional NAME=VALUE assignment. A Disabled assignment is
// written commented out, as a suggestion the operator has to complete.
type EnvLine struct {
	// Comment is written before the assignment, one "# " line per line of
	// text. Empty means no comment.
	Comment string
	// Name is the variable name; empty for a comment-only entry.
	Name string
	// Value is the unquoted value; WriteEnv quotes it when needed.
	Value string
	// Disabled writes the assignment as "#NAME=VALUE".
	Disabled bool
}

// Result is the outcome of a migration: the env file, in order, and the
// warnings an operator must read before using it.
type Result struct {
	Env      []EnvLine
	Warnings []string
}

// Lookup returns the value of the enabled assignment of name, if any.
func (r Result) Lookup(name string) (string, bool) {
	for _, l := range r.Env {
		if l.Name == name && !l.Disabled {
			return l.Value, true
		}
	}
	return "", false
}

// WriteEnv writes the env file in the syntax systemd's EnvironmentFile=
// and `docker --env-file`-style readers accept: comments start with "#",
// values that need it are double-quoted with \ " $ ` escaped.
func (r Result) WriteEnv(w io.Writer) error {
	bw := bufio.NewWriter(w)
	for i, l := range r.Env {
		if i > 0 && l.Comment != "" {
			bw.WriteString("\n")
		}
		if l.Comment != "" {
			for _, c := range strings.Split(l.Comment, "\n") {
				if c == "" {
					bw.WriteString("#\n")
					continue
				}
				bw.WriteString("# " + c + "\n")
			}
		}
		if l.Name != "" {
			if l.Disabled {
				bw.WriteString("#")
			}
			bw.WriteString(l.Name + "=" + QuoteEnvValue(l.Value) + "\n")
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write env file: %w", err)
	}
	return nil
}

// WriteWarnings writes each warning on its own line prefixed with
// "warning: ", the form the CLI prints on standard error.
func (r Result) WriteWarnings(w io.Writer) error {
	for _, s := range r.Warnings {
		if _, err := fmt.Fprintf(w, "warning: %s\n", s); err != nil {
			return fmt.Errorf("write warnings: %w", err)
		}
	}
	return nil
}

// QuoteEnvValue returns v as it must appear after NAME= in an env file
// (see config.QuoteEnvValue).
func QuoteEnvValue(v string) string { return config.QuoteEnvValue(v) }

// builder accumulates a Result; it exists only during one migration.
type builder struct {
	res Result
}

func (b *builder) set(name, value, comment string) {
	b.res.Env = append(b.res.Env, EnvLine{Name: name, Value: value, Comment: comment})
}

func (b *builder) suggest(name, value, comment string) {
	b.res.Env = append(b.res.Env, EnvLine{Name: name, Value: value, Comment: comment, Disabled: true})
}

func (b *builder) comment(text string) {
	b.res.Env = append(b.res.Env, EnvLine{Comment: text})
}

func (b *builder) warn(format string, args ...any) {
	b.res.Warnings = append(b.res.Warnings, fmt.Sprintf(format, args...))
}
