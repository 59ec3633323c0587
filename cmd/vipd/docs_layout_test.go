package main

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layoutLines returns the directories the Layout section of
// docs/architecture.md names, one per line of its text block, in order.
func layoutLines(doc string) ([]string, error) {
	groups, err := layoutGroups(doc)
	var dirs []string
	for _, g := range groups {
		dirs = append(dirs, g.dirs...)
	}
	return dirs, err
}

// layoutGroup is one group of the Layout block: its "# " header line and
// its directories.
type layoutGroup struct {
	header string
	dirs   []string
}

func layoutGroups(doc string) ([]layoutGroup, error) {
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
	var groups []layoutGroup
	for _, line := range strings.Split(block, "\n") {
		switch {
		case line == "":
		case strings.HasPrefix(line, "#"):
			groups = append(groups, layoutGroup{header: line})
		case len(groups) == 0:
			groups = append(groups, layoutGroup{dirs: []string{strings.Fields(line)[0]}})
		default:
			g := &groups[len(groups)-1]
			g.dirs = append(g.dirs, strings.Fields(line)[0])
		}
	}
	return groups, nil
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

// deps lists the packages of this module (as directories) and whether
// client-go is among the dependencies of pkg.
func deps(t *testing.T, root, pkg string) (map[string]bool, bool) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	const mod = "github.com/vipd/vipd/"
	dirs, clientGo := map[string]bool{}, false
	for _, p := range strings.Fields(string(out)) {
		if d, ok := strings.CutPrefix(p, mod); ok {
			dirs[d] = true
		}
		clientGo = clientGo || strings.HasPrefix(p, "k8s.io/client-go/")
	}
	return dirs, clientGo
}

// TestArchitectureLayoutGroups checks the Layout's groups against what
// each binary links: vipd links no client-go and nothing of the
// controllers' group, vipd-controllers nothing of the daemon's, both
// link every package of the shared group, and neither the tests' group.
func TestArchitectureLayoutGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const root = "../.."
	doc, err := os.ReadFile(filepath.Join(root, "docs/architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	groups, err := layoutGroups(string(doc))
	if err != nil || len(groups) != 4 {
		t.Fatalf("docs/architecture.md Layout: want 4 groups (daemon, controllers, shared, tests), got %d (%v)", len(groups), err)
	}
	daemon, daemonClientGo := deps(t, root, "./cmd/vipd")
	ctrl, _ := deps(t, root, "./cmd/vipd-controllers")
	if daemonClientGo {
		t.Error("vipd links client-go")
	}
	for _, d := range groups[0].dirs {
		if ctrl[d] {
			t.Errorf("%s is in the daemon's group, but vipd-controllers links it", d)
		}
	}
	for _, d := range groups[1].dirs {
		if daemon[d] {
			t.Errorf("%s is in the controllers' group, but vipd links it", d)
		}
	}
	for _, d := range groups[2].dirs {
		if !daemon[d] || !ctrl[d] {
			t.Errorf("%s is in the shared group; linked by vipd: %v, by vipd-controllers: %v", d, daemon[d], ctrl[d])
		}
	}
	for _, d := range groups[3].dirs {
		if daemon[d] || ctrl[d] {
			t.Errorf("%s is in the tests' group, but a binary links it", d)
		}
	}
	for d := range daemon {
		if !slices.Contains(groups[0].dirs, d) && !slices.Contains(groups[2].dirs, d) {
			t.Errorf("vipd links %s, which is in neither the daemon's nor the shared group", d)
		}
	}
	for d := range ctrl {
		if !slices.Contains(groups[1].dirs, d) && !slices.Contains(groups[2].dirs, d) {
			t.Errorf("vipd-controllers links %s, which is in neither the controllers' nor the shared group", d)
		}
	}
}
