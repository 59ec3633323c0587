package config

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestParseEnvFileRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want map[string]string
	}{
		{"plain", "A=1\nB=two\n", map[string]string{"A": "1", "B": "two"}},
		{"no final newline", "A=1", map[string]string{"A": "1"}},
		{"hash comment", "# A=1\nB=2\n", map[string]string{"B": "2"}},
		{"semicolon comment", "; A=1\nB=2\n", map[string]string{"B": "2"}},
		{"indented comment", "   \t# A=1\nB=2\n", map[string]string{"B": "2"}},
		{"inline hash kept", "VIPD_MODE=l2 # the mode\n", map[string]string{"VIPD_MODE": "l2 # the mode"}},
		{"inline hash without blank kept", "A=x#y\n", map[string]string{"A": "x#y"}},
		{"inline semicolon kept", "A=x ; y\n", map[string]string{"A": "x ; y"}},
		{"blanks around name and before value", "  A  =   v\n", map[string]string{"A": "v"}},
		{"trailing blanks cut", "A=v \t \n", map[string]string{"A": "v"}},
		{"inner blanks kept", "A=a  b\n", map[string]string{"A": "a  b"}},
		{"empty value", "A=\nB=  \n", map[string]string{"A": "", "B": ""}},
		{"empty value at end of file", "A=", map[string]string{"A": ""}},
		{"single quotes literal", `A='a "b" \n $c # d'` + "\n", map[string]string{"A": `a "b" \n $c # d`}},
		{"single quotes keep blanks", "A='  x  '\n", map[string]string{"A": "  x  "}},
		{"single quotes span lines", "A='x\ny'\n", map[string]string{"A": "x\ny"}},
		{"double quotes", `A="a b"` + "\n", map[string]string{"A": "a b"}},
		{"double quote escapes", `A="q\" b\\ t\` + "`" + ` d\$"` + "\n", map[string]string{"A": "q\" b\\ t` d$"}},
		{"double quote other escape keeps backslash", `A="a\nb\tc\x"` + "\n", map[string]string{"A": `a\nb\tc\x`}},
		{"double quotes span lines", "A=\"x\ny\"\n", map[string]string{"A": "x\ny"}},
		{"double quote continuation", "A=\"x\\\ny\"\n", map[string]string{"A": "xy"}},
		{"text after closing quote joins", `A="x"y` + "\n", map[string]string{"A": "xy"}},
		{"blank after closing quote skipped", `A="x" y` + "\n", map[string]string{"A": "xy"}},
		{"comment after closing quote is value", `A="x" # y` + "\n", map[string]string{"A": "x# y"}},
		{"two quoted parts", `A='x' "y"` + "\n", map[string]string{"A": "xy"}},
		{"quote inside unquoted value literal", `A=a"b"c` + "\n", map[string]string{"A": `a"b"c`}},
		{"unquoted backslash escapes", `A=a\ b\#c\\d` + "\n", map[string]string{"A": `a b#c\d`}},
		{"escaped trailing blank kept", "A=x\\ \n", map[string]string{"A": "x "}},
		{"escaped blank then blanks", "A=x\\   \n", map[string]string{"A": "x "}},
		{"leading backslash", `A=\$HOME` + "\n", map[string]string{"A": "$HOME"}},
		{"continuation", "A=one\\\ntwo\nB=3\n", map[string]string{"A": "onetwo", "B": "3"}},
		{"continuation keeps leading blanks", "A=one \\\n  two\n", map[string]string{"A": "one   two"}},
		{"no expansion", "A=$HOME ${B}\n", map[string]string{"A": "$HOME ${B}"}},
		{"later wins", "A=1\nA=2\n", map[string]string{"A": "2"}},
		{"line without equals skipped", "JUNK\nA=1\n", map[string]string{"A": "1"}},
		{"CRLF", "A=1\r\nB='x'\r\n", map[string]string{"A": "1", "B": "x"}},
		{"comment ending in backslash does not continue (v254+)", "# a \\\nA=1\n", map[string]string{"A": "1"}},
		{"equals in value", "A=b=c\n", map[string]string{"A": "b=c"}},
		{"unterminated quote runs to end", "A=\"x\nB=1\n", map[string]string{"A": "x\nB=1\n"}},
		{"invalid name dropped", "export A=1\n1B=2\nC-D=3\nE=4\n", map[string]string{"E": "4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ParseEnvFile([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if got := f.Map(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseEnvFile(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseEnvFileIgnoredAndErrors(t *testing.T) {
	f, err := ParseEnvFile([]byte("A=1\nexport VIPD_MODE=bgp\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Warnings) != 1 || !strings.Contains(f.Warnings[0], "line 2") || !strings.Contains(f.Warnings[0], `"export VIPD_MODE"`) {
		t.Fatalf("Warnings = %q", f.Warnings)
	}
	for _, in := range []string{"A=\xff\n", "\xffA=1\n", "A='\xc3'\n"} {
		_, err := ParseEnvFile([]byte("X=1\n" + in))
		var fe *EnvFileError
		if !errors.As(err, &fe) || fe.Line != 2 || !strings.Contains(err.Error(), "UTF-8") {
			t.Errorf("ParseEnvFile(%q) error = %v, want an *EnvFileError on line 2", in, err)
		}
	}
	f, err = ParseEnvFile([]byte("# a comment \\\nA=1\n"))
	if err != nil || f.Map()["A"] != "1" || len(f.Warnings) != 1 || !strings.Contains(f.Warnings[0], "line 1: a comment ends in a backslash") {
		t.Fatalf("comment with a backslash: %q, %q, %v", f.Map(), f.Warnings, err)
	}
	f, err = ParseEnvFile([]byte("A=1\nA=2\n"))
	if err != nil || len(f.Vars) != 1 || f.Vars[0].Line != 2 {
		t.Fatalf("Vars = %+v, %v", f.Vars, err)
	}
}

// TestParseEnvFileTricky pins testdata/tricky.env, the file the packaging
// test also hands to systemd itself (test/packaging/envfile_test.go).
func TestParseEnvFileTricky(t *testing.T) {
	b, err := os.ReadFile("testdata/tricky.env")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ParseEnvFile(b)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"T_PLAIN":         "10.0.0.100/32",
		"T_INLINE":        "l2 # the mode",
		"T_INLINE_SEMI":   "x ; y",
		"T_BLANKS":        "v",
		"T_TRAIL":         "v",
		"T_EMPTY":         "",
		"T_SQ":            `a "b" \n $c # d`,
		"T_SQ_BLANKS":     "  x  ",
		"T_DQ":            "q\" b\\ t` d$",
		"T_DQ_OTHER":      `a\nb\x`,
		"T_DQ_MULTI":      "x\ny",
		"T_DQ_CONT":       "xy",
		"T_AFTER_QUOTE":   "xy",
		"T_QUOTE_COMMENT": "x# y",
		"T_TWO_QUOTES":    "xy",
		"T_MID_QUOTE":     `a"b"c`,
		"T_ESC":           `a b#c\d`,
		"T_ESC_TRAIL":     "x ",
		"T_DOLLAR":        "$HOME",
		"T_CONT":          "onetwo",
		"T_CONT_BLANKS":   "one   two",
		"T_NOEXPAND":      "$HOME ${T_PLAIN}",
		"T_TWICE":         "second",
		"T_EQUALS":        "b=c",
		"T_UTF8":          "é ü",
		"T_LAST":          "no newline at the end",
	}
	if got := f.Map(); !reflect.DeepEqual(got, want) {
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s = %q, want %q", k, got[k], v)
			}
		}
		for k, v := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("unexpected %s = %q", k, v)
			}
		}
	}
	if len(f.Warnings) != 2 {
		t.Errorf("Warnings = %q, want the export line and the digit name", f.Warnings)
	}
}

// TestQuoteEnvValueReadsBack: what WriteEnvFile writes, systemd reads back
// unchanged (values without newlines: no setting accepts one).
func TestQuoteEnvValueReadsBack(t *testing.T) {
	for _, v := range []string{"", "plain", "a b", `q"uote`, "dollar$HOME", `back\slash`, "hash #tag", "tick`", "x'y", " lead", "trail ", "é", "[fd00::1]:65000:password=p"} {
		line := "A=" + QuoteEnvValue(v) + "\n"
		f, err := ParseEnvFile([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Map()["A"]; got != v {
			t.Errorf("%q written as %q reads back as %q", v, line, got)
		}
	}
}
