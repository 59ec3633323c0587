package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Build is a test package's vipd binary: $VIPD_TEST_BINARY, or vipd and
// vipd-controllers built once (VipdBinary) into a temporary directory the
// first time a test asks. Declare one per package and Remove it in
// TestMain:
//
//	var bin = lab.Build{Controllers: true}
//
//	func TestMain(m *testing.M) { code := m.Run(); bin.Remove(); os.Exit(code) }
type Build struct {
	// Controllers: the tests need vipd-controllers next to vipd (where
	// vipd looks for it); Path fails the test when it is not there.
	Controllers bool

	once sync.Once
	dir  string
	path string
	err  error
}

// Path returns the vipd binary, building it on first use; a failed build
// fails every test that asks.
func (b *Build) Path(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if b.dir, b.err = os.MkdirTemp("", "vipd-test-bin-"); b.err == nil {
			b.path, b.err = VipdBinary(ctx, b.dir)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	if b.Controllers {
		if _, err := os.Stat(filepath.Join(filepath.Dir(b.path), "vipd-controllers")); err != nil {
			t.Fatal(fmt.Errorf("vipd-controllers is not next to %s (make builds both): %w", b.path, err))
		}
	}
	return b.path
}

// Remove deletes what Path built (nothing when $VIPD_TEST_BINARY was used).
func (b *Build) Remove() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}
