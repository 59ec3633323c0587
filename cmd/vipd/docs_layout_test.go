package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layoutLines returns the directories the Layout section of
// docs/architecture.md names, one per line of its text block, in order.
func layoutLines(doc string) ([]string, error) {
	_, after, ok := strings.Cut(doc, "\n## Layout\n")
	if !ok {
		return nil, os.ErrNotExist
	}
	_, block, ok := strings.Cut(after, "```text\n")
	if !ok {
		return nil, os.ErrNotExist
	}
	block, _, ok = strings.Cut(block, "```")
	if !ok {
		return nil, os.ErrNotExist
	}
	var dirs []string
	for _, line := range strings.Split(block, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		dirs = append(dirs, strings.Fields(line)[0])
	}
	return dirs, nil
}

// goDirs returns every directory below root holding a .go file (the
// shared .cache, .git and testdata left out), relative to root.
func goDirs(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && p != root && (strings.HasPrefix(name, ".") || name == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		if !slices.Contains(dirs, rel) {
			dirs = append(dirs, rel)
		}
		return nil
	})
	return dirs, err
}

// TestArchitectureLayout keeps docs/architecture.md's Layout in step with
// the tree: every directory with Go code has its one line, and every line
// names a directory that exists, once.
func TestArchitectureLayout(t *testing.T) {
	const root = "../.."
	doc, err := os.ReadFile(filepath.Join(root, "docs/architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines, err := layoutLines(string(doc))
	if err != nil || len(lines) == 0 {
		t.Fatalf("docs/architecture.md: no ```text block under \"## Layout\" (%v)", err)
	}
	seen := map[string]bool{}
	for _, d := range lines {
		if seen[d] {
			t.Errorf("docs/architecture.md Layout: %s has two lines", d)
		}
		seen[d] = true
		if st, err := os.Stat(filepath.Join(root, d)); err != nil || !st.IsDir() {
			t.Errorf("docs/architecture.md Layout names %s, which is no directory of the tree", d)
		}
	}
	pkgs, err := goDirs(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		if !seen[filepath.ToSlash(p)] {
			t.Errorf("docs/architecture.md Layout has no line for the Go package directory %s", p)
		}
	}
}

// TestLayoutLines checks the parser on a small document: comments and
// blank lines are no directories, and a missing block is an error.
func TestLayoutLines(t *testing.T) {
	doc := "# A\n\n## Layout\n\ntext\n\n```text\n# group\ncmd/vipd   the binary\n\nvip        core\n```\n\n## Next\n"
	got, err := layoutLines(doc)
	if err != nil || !slices.Equal(got, []string{"cmd/vipd", "vip"}) {
		t.Fatalf("layoutLines = %q, %v", got, err)
	}
	if _, err := layoutLines("# A\n\n## Layout\n\nno block\n"); err == nil {
		t.Fatal("a Layout without a text block parsed")
	}
}
