package cloud

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTokenSource(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, ctrl, two := write("good", "tok-1\n"), write("ctrl", "tok\x01x\n"), write("two", "a b\n")
	for _, tc := range []struct {
		name, token, file string
		want, setting     string // want: the token; setting: the SettingError's name
	}{
		{"setting wins over the file", " tok-env ", good, "tok-env", ""},
		{"file", "", good, "tok-1", ""},
		{"none", "", "", "", "TOKEN_ENV"},
		{"control character in the setting", "tok\x7f", "", "", "TOKEN_ENV"},
		{"control character in the file", "", ctrl, "", "TOKEN_FILE"},
		{"two words in the file", "", two, "", "TOKEN_FILE"},
		{"missing file", "", filepath.Join(dir, "nope"), "", "TOKEN_FILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &tokenSource{token: tc.token, file: tc.file, envName: "TOKEN_ENV", fileName: "TOKEN_FILE", what: "a token", needs: "x", log: slog.New(slog.DiscardHandler)}
			err := src.load()
			var se *SettingError
			switch {
			case tc.setting == "" && (err != nil || src.get() != tc.want):
				t.Fatalf("load: %v, token %q; want %q", err, src.get(), tc.want)
			case tc.setting != "" && (!errors.As(err, &se) || se.Name != tc.setting):
				t.Fatalf("load: %v, want a SettingError for %s", err, tc.setting)
			case err != nil && (strings.Contains(err.Error(), "tok\x01") || strings.Contains(err.Error(), "tok\x7f")):
				t.Fatalf("the token is echoed: %v", err)
			}
		})
	}
	// reload: only from a file, only when it changed.
	p := write("rot", "old\n")
	src := &tokenSource{file: p, envName: "E", fileName: "F", what: "a token", log: slog.New(slog.DiscardHandler)}
	if err := src.load(); err != nil {
		t.Fatal(err)
	}
	if src.reload() {
		t.Fatal("reload reported a change of an unchanged file")
	}
	write("rot", "new\n")
	if !src.reload() || src.get() != "new" {
		t.Fatalf("reload after rotation: %q", src.get())
	}
}
