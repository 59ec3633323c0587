package lab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// VipdAt returns a vipd binary built from commit of the repository the
// tests run in (an upgrade test's "previous release"). The source comes from
// `git archive`, so the work tree and its branches are never touched; the
// binary is cached under .cache/vipd-at/<full commit>/vipd at the module
// root (git-ignored; the user's cache directory when .cache is unusable),
// built once even when several tests or work trees ask at the same time. $VIPD_TEST_PREVIOUS_BINARY, when set, is used instead
// (and must exist).
func VipdAt(ctx context.Context, commit string) (string, error) {
	if p := os.Getenv("VIPD_TEST_PREVIOUS_BINARY"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("VIPD_TEST_PREVIOUS_BINARY: %w", err)
		}
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--verify", "--quiet", commit+"^{commit}").Output()
	if err != nil {
		return "", fmt.Errorf("commit %s is not in the repository at %s (a shallow clone? fetch it or set VIPD_TEST_PREVIOUS_BINARY): %w", commit, root, err)
	}
	full := strings.TrimSpace(string(out))
	dir := filepath.Join(root, ".cache", "vipd-at", full)
	bin := filepath.Join(dir, "vipd")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		// .cache unusable (e.g. a dangling link to a shared cache): the
		// user's cache directory will do.
		cache, cerr := os.UserCacheDir()
		if cerr != nil {
			return "", fmt.Errorf("%w (and no user cache directory: %w)", err, cerr)
		}
		dir = filepath.Join(cache, "vipd-lab", "vipd-at", full)
		bin = filepath.Join(dir, "vipd")
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
	}
	// One builder at a time; the others wait and find the binary.
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", dir, err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	src, err := os.MkdirTemp(dir, "src-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", full)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return "", err
	}
	untar.Stdin = pipe
	var aerr, terr strings.Builder
	archive.Stderr, untar.Stderr = &aerr, &terr
	if err := untar.Start(); err != nil {
		return "", err
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return "", fmt.Errorf("git archive %s: %w: %s", full, err, aerr.String())
	}
	if err := untar.Wait(); err != nil {
		return "", fmt.Errorf("untar %s: %w: %s", full, err, terr.String())
	}
	tmp := bin + ".tmp"
	build := exec.CommandContext(ctx, "go", "build", "-ldflags", "-X main.version=git-"+full[:7], "-o", tmp, "./cmd/vipd")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/vipd at %s: %w: %s", full, err, b)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}
