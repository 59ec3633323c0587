package config

import (
	"os"
	"strings"
	"testing"
)

// docs/configuration.md is generated from the table; keep them in step.
func TestConfigurationDocUpToDate(t *testing.T) {
	var b strings.Builder
	if err := WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	const path = "../docs/configuration.md"
	if os.Getenv("UPDATE") != "" {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != b.String() {
		t.Fatalf("%s is out of date: run UPDATE=1 go test ./config", path)
	}
}
