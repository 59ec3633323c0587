package config

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
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

// EnvVar is one variable of an env file.
type EnvVar struct {
	Name  string
	Value string
	Line  int // where its assignment starts (1-based); the last one wins
}

// EnvFile is what systemd's EnvironmentFile= makes of a file: the
// variables a unit receives, and the assignments systemd drops.
type EnvFile struct {
	Vars []EnvVar // in order of first assignment, each name once, last value wins
	// Warnings describe lines systemd reads differently from what they
	// seem to say, one line each: assignments systemd drops (a name that
	// is not a valid variable name, such as "export X"), and comments
	// ending in a backslash (before systemd v254 the next line is part of
	// the comment too).
	Warnings []string
}

// Map returns the variables as a map.
func (f EnvFile) Map() map[string]string {
	m := make(map[string]string, len(f.Vars))
	for _, v := range f.Vars {
		m[v.Name] = v.Value
	}
	return m
}

// EnvFileError is a file that systemd refuses to load: the unit does not
// start at all.
type EnvFileError struct {
	Line   int
	Reason string
}

func (e *EnvFileError) Error() string {
	return fmt.Sprintf("line %d: %s (systemd refuses the whole file and the unit does not start)", e.Line, e.Reason)
}

// ParseEnvFile reads an env file exactly as systemd's EnvironmentFile= does
// (systemd.exec(5); the env-file parser of systemd v254 and later):
//
//   - A line whose first non-blank character is # or ; is a comment. There
//     are no comments after a value: VIPD_MODE=l2 # x sets "l2 # x".
//   - Blanks around the name, and before the value, are ignored; blanks at
//     the end of an unquoted value are removed.
//   - Unquoted, a backslash takes the next character literally; a backslash
//     at the end of a line joins the next line.
//   - 'single quotes' keep everything literally, newlines included.
//   - "double quotes" keep everything; a backslash before " \ ` $ gives
//     that character, before a newline joins the lines, before anything
//     else stays a backslash.
//   - Text right after a closing quote continues the value (blanks between
//     are skipped): A="x" y gives "xy", A="x" # y gives "x# y".
//   - A line without = is skipped. A later assignment replaces an earlier one.
//   - A name that is not letters, digits and _ (not starting with a digit)
//     is dropped by systemd with a log message: listed in Warnings.
//   - A comment ending in a backslash ends at the line's end (v254 and
//     later); older systemd also skips the next line: listed in Warnings.
//   - Invalid UTF-8 in a name or value makes systemd refuse the file: an
//     *EnvFileError.
//
// No variable expansion happens: $X stays $X.
func ParseEnvFile(data []byte) (EnvFile, error) {
	const (
		preKey = iota
		inKey
		preValue
		inValue
		valueEscape
		singleQuote
		doubleQuote
		doubleQuoteEscape
		comment
		commentEscape
	)
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	isNewline := func(c byte) bool { return c == '\n' || c == '\r' }

	var (
		out          EnvFile
		index        = map[string]int{}
		key, value   []byte
		keyTrim      = -1 // start of trailing blanks in key, -1: none
		valueTrim    = -1 // start of trailing blanks in an unquoted value
		line, keyAt  = 1, 1
		state        = preKey
		errFromPush  error
		pushAssigned = func(trimValue bool) {
			k := key
			if keyTrim >= 0 {
				k = k[:keyTrim]
			}
			v := value
			if trimValue && valueTrim >= 0 {
				v = v[:valueTrim]
			}
			name, val := string(k), string(v)
			switch {
			case !utf8.ValidString(name):
				if errFromPush == nil {
					errFromPush = &EnvFileError{Line: keyAt, Reason: "invalid UTF-8 in a variable name"}
				}
			case !utf8.ValidString(val):
				if errFromPush == nil {
					errFromPush = &EnvFileError{Line: keyAt, Reason: fmt.Sprintf("invalid UTF-8 in the value of %s", name)}
				}
			case !validEnvName(name):
				out.Warnings = append(out.Warnings, fmt.Sprintf("line %d: %q is not a valid variable name (letters, digits and _, not starting with a digit); systemd ignores the assignment", keyAt, name))
			default:
				if i, ok := index[name]; ok {
					out.Vars[i].Value, out.Vars[i].Line = val, keyAt
				} else {
					index[name] = len(out.Vars)
					out.Vars = append(out.Vars, EnvVar{Name: name, Value: val, Line: keyAt})
				}
			}
			key, value = key[:0], nil
		}
	)
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch state {
		case preKey:
			switch {
			case c == '#' || c == ';':
				state = comment
			case !isSpace(c):
				state, keyTrim, keyAt = inKey, -1, line
				key = append(key[:0], c)
			}
		case inKey:
			switch {
			case isNewline(c):
				state, key = preKey, key[:0] // a name without "=": skipped
			case c == '=':
				state, valueTrim = preValue, -1
			default:
				if !isSpace(c) {
					keyTrim = -1
				} else if keyTrim < 0 {
					keyTrim = len(key)
				}
				key = append(key, c)
			}
		case preValue:
			switch {
			case isNewline(c):
				state = preKey
				pushAssigned(false)
			case c == '\'':
				state = singleQuote
			case c == '"':
				state = doubleQuote
			case c == '\\':
				state = valueEscape
			case !isSpace(c):
				state = inValue
				value = append(value, c)
			}
		case inValue:
			switch {
			case isNewline(c):
				state = preKey
				pushAssigned(true)
			case c == '\\':
				state, valueTrim = valueEscape, -1
			default:
				if !isSpace(c) {
					valueTrim = -1
				} else if valueTrim < 0 {
					valueTrim = len(value)
				}
				value = append(value, c)
			}
		case valueEscape:
			state = inValue
			if !isNewline(c) { // an escaped newline joins the lines
				value = append(value, c)
			}
		case singleQuote:
			if c == '\'' {
				state = preValue
			} else {
				value = append(value, c)
			}
		case doubleQuote:
			switch c {
			case '"':
				state = preValue
			case '\\':
				state = doubleQuoteEscape
			default:
				value = append(value, c)
			}
		case doubleQuoteEscape:
			state = doubleQuote
			switch {
			case c == '"' || c == '\\' || c == '`' || c == '$':
				value = append(value, c)
			case c != '\n':
				value = append(value, '\\', c)
			}
		case comment:
			if c == '\\' {
				state = commentEscape
			} else if isNewline(c) {
				state = preKey
			}
		case commentEscape:
			// Since systemd v254 a backslash at the end of a comment no
			// longer continues the comment.
			if isNewline(c) {
				state = preKey
				out.Warnings = append(out.Warnings, fmt.Sprintf("line %d: a comment ends in a backslash: systemd before v254 (Debian 12, Ubuntu 22.04) also ignores line %d; remove the backslash", line, line+1))
			} else {
				state = comment
			}
		}
		if c == '\n' {
			line++
		}
		if errFromPush != nil {
			return EnvFile{}, errFromPush
		}
	}
	switch state {
	case preValue, valueEscape, singleQuote, doubleQuote, doubleQuoteEscape:
		pushAssigned(false)
	case inValue:
		pushAssigned(true)
	}
	if errFromPush != nil {
		return EnvFile{}, errFromPush
	}
	return out, nil
}

// validEnvName is systemd's (and bash's) rule for variable names.
func validEnvName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
