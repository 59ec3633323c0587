package migrate

import (
	"fmt"
	"regexp"
	"strings"
)

var unitSectionRE = regexp.MustCompile(`^\[(Unit|Service|Install)\]$`)

// looksLikeUnit reports whether the first meaningful line is a systemd
// section header.
func looksLikeUnit(data []byte) bool {
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";") {
			continue
		}
		return unitSectionRE.MatchString(l)
	}
	return false
}

// parseUnit reads a systemd service unit: the words of ExecStart= become
// args, Environment= assignments become variables. Lines ending in a
// backslash continue on the next line, as in systemd.
func parseUnit(data []byte) (*source, error) {
	src := &source{Describe: "systemd unit"}
	lines := strings.Split(string(data), "\n")
	section := ""
	for i := 0; i < len(lines); i++ {
		start := i + 1
		l := strings.TrimSpace(strings.TrimSuffix(lines[i], "\r"))
		for strings.HasSuffix(l, "\\") && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, "\\") + " " + strings.TrimSpace(strings.TrimSuffix(lines[i], "\r"))
		}
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";") {
			continue
		}
		if strings.HasPrefix(l, "[") {
			if !strings.HasSuffix(l, "]") {
				return nil, fmt.Errorf("line %d: unterminated section header %q", start, truncate(l, 60))
			}
			section = l
			continue
		}
		key, value, ok := strings.Cut(l, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: expected Key=value in a systemd unit, got %q", start, truncate(l, 60))
		}
		if section != "[Service]" {
			continue
		}
		switch strings.TrimSpace(key) {
		case "ExecStart":
			words, err := unitWords(strings.TrimLeft(strings.TrimSpace(value), "-@:+!"))
			if err != nil {
				return nil, fmt.Errorf("line %d: ExecStart: %w", start, err)
			}
			if len(words) > 0 {
				src.Args = words[1:]
			}
		case "Environment":
			words, err := unitWords(value)
			if err != nil {
				return nil, fmt.Errorf("line %d: Environment: %w", start, err)
			}
			for _, w := range words {
				name, v, ok := strings.Cut(w, "=")
				if !ok || !envLineRE.MatchString(name+"=") {
					return nil, fmt.Errorf("line %d: Environment: %q is not NAME=VALUE", start, w)
				}
				src.Vars = append(src.Vars, variable{Name: name, Value: v, Line: start})
			}
		case "EnvironmentFile":
			src.Notes = append(src.Notes, fmt.Sprintf("the unit reads EnvironmentFile=%s: migrate that file too (vipd migrate novaedge FILE)", strings.TrimSpace(value)))
		}
	}
	return src, nil
}

// unitWords splits a systemd command line or Environment= value into words,
// honouring double and single quotes and backslash escapes.
func unitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '"' || c == '\'':
			end := strings.IndexByte(s[i+1:], c)
			if end < 0 {
				return nil, fmt.Errorf("unterminated %c quote", c)
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
