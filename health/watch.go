package health

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// How often credential files are looked at again. A loaded file is
// re-read when it was replaced or its symbolic link retargeted (seen with a
// stat, at most every checkEvery), and unconditionally every rereadEvery in
// case a rewrite in place kept its size and time stamp. A file that exists
// but could not be used (half written) is read again on every probe. A
// missing file is looked for again (a stat; it is read once the stat finds
// it) every checkEvery, and on every probe while the apiserver refuses the
// probe (HTTP 401 or 403: the answer a credential would change), so a
// credential that appears then is used at the next probe. Every probe used
// to look: a stat is a regular system call, and each one woke the Go
// runtime's monitor thread on every node once a probe before the cluster's
// credentials existed.
const (
	checkEvery  = 5 * time.Second
	rereadEvery = 5 * time.Minute
)

// fileID tells two versions of a file apart without reading it: the link
// target when the path is a symbolic link (kubelet retargets
// kubelet-client-current.pem on rotation; projected token volumes swap a
// ..data link), and device, inode, size and modification time of what the
// path resolves to (an atomic rename gives a new inode).
type fileID struct {
	link      string
	dev, ino  uint64
	size      int64
	mtimeNano int64
}

// statFile returns the fileID of path. A missing file or a regular one
// costs one system call: before bootstrap every probe looks for the
// credentials, and every system call wakes the Go runtime's sleeping
// monitor thread, a measurable part of an idle node's CPU.
func statFile(path string) (fileID, error) {
	var id fileID
	fi, err := os.Lstat(path)
	if err != nil {
		return fileID{}, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if id.link, err = os.Readlink(path); err != nil {
			return fileID{}, err
		}
		if fi, err = os.Stat(path); err != nil {
			return fileID{}, err
		}
	}
	id.size, id.mtimeNano = fi.Size(), fi.ModTime().UnixNano()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino //nolint:unconvert // Dev is int32 on some platforms
	}
	return id, nil
}

// watch is the re-read decision for one file. It does no I/O itself: the
// caller passes the clock and a stat function, so the rule is table-tested
// with a fake clock.
type watch struct {
	loaded  bool      // the last read gave a usable value
	absent  bool      // the last read found no file
	id      fileID    // identity at the last successful read
	readAt  time.Time // last successful read
	checkAt time.Time // last identity check
}

// due reports whether the file must be read now. A missing file is due
// every checkEvery, or at once when eager (the apiserver refused the last
// probe); one that could not be used, at once. stat is called only when a
// loaded file's identity is due for a check.
func (w *watch) due(now time.Time, eager bool, path string, stat func(string) (fileID, error)) bool {
	if !w.loaded {
		if w.absent && !eager && now.Sub(w.checkAt) < checkEvery && !now.Before(w.checkAt) {
			return false
		}
		w.checkAt = now
		return true
	}
	if now.Sub(w.readAt) >= rereadEvery || now.Before(w.readAt) {
		return true
	}
	if now.Sub(w.checkAt) < checkEvery && !now.Before(w.checkAt) {
		return false
	}
	w.checkAt = now
	id, err := stat(path)
	return err != nil || id != w.id
}

// read records a read at now: ok tells whether the content was usable and
// id is the identity taken just before reading it (zero: the stat found no
// file).
func (w *watch) read(now time.Time, id fileID, ok bool) {
	w.loaded = ok
	w.absent = !ok && id == fileID{}
	if ok {
		w.id, w.readAt, w.checkAt = id, now, now
	}
}

// notFound reports whether err means the file does not exist (yet).
func notFound(err error) bool { return errors.Is(err, fs.ErrNotExist) }
