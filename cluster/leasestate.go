package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/vipd/vipd/internal/atomicfile"
)

// LeaseStateFile is the lease election's state in VIPD_STATE_DIR: what the
// machine asked to persist (raft's hard state, configuration and log), in
// an envelope that tells a damaged file from an empty one.
const LeaseStateFile = "lease.state"

// leaseStateMagic starts the file; the version after it changes when the
// envelope does.
var leaseStateMagic = []byte("vipd-lease\x00\x01")

// leaseStateMax bounds what is read back (the state is a few KB).
const leaseStateMax = 16 << 20

// errLeaseStateDamaged explains what to do with a state file that cannot
// be read: it must never be replaced silently (a node that forgets its
// votes could help elect a second holder, and one that forgets its
// cluster could bootstrap another).
const leaseStateAdvice = "stop vipd on this node, run `vipd forget <this node>` on a node of the cluster, remove the file, and start vipd again (it joins as a new member through VIPD_PEERS)"

// stateFile writes and reads the lease state atomically.
type stateFile struct{ path string }

func newStateFile(dir string) stateFile {
	return stateFile{path: filepath.Join(dir, LeaseStateFile)}
}

// Load returns the persisted state, nil when there is none (a node that
// never ran, or a fresh state directory). A file that exists but cannot
// be read back whole is an error naming the file and what to do.
func (s stateFile) Load() ([]byte, error) {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lease state %s cannot be read (%w): fix its permissions, or %s", s.path, err, leaseStateAdvice)
	}
	data, err := unwrapState(b)
	if err != nil {
		return nil, fmt.Errorf("lease state %s is damaged (%v): %s", s.path, err, leaseStateAdvice)
	}
	return data, nil
}

func unwrapState(b []byte) ([]byte, error) {
	n := len(leaseStateMagic)
	if len(b) < n+8 || !bytes.Equal(b[:n], leaseStateMagic) {
		return nil, errors.New("not a vipd lease state file")
	}
	size := binary.BigEndian.Uint32(b[n:])
	sum := binary.BigEndian.Uint32(b[n+4:])
	data := b[n+8:]
	if uint64(size) != uint64(len(data)) || size > leaseStateMax {
		return nil, fmt.Errorf("%d bytes of state, header says %d", len(data), size)
	}
	if crc32.ChecksumIEEE(data) != sum {
		return nil, errors.New("checksum mismatch")
	}
	return data, nil
}

func wrapState(data []byte) []byte {
	b := make([]byte, 0, len(leaseStateMagic)+8+len(data))
	b = append(b, leaseStateMagic...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(data))
	return append(b, data...)
}

// Save replaces the state atomically and durably: a temporary file in the
// same directory, written and synced, renamed over the old one, and the
// directory synced. Whatever happens, the file holds the old or the new
// state, never a mix. It returns once the state is on disk: the messages
// that depend on it are sent only then.
func (s stateFile) Save(data []byte) error {
	if len(data) > leaseStateMax {
		return fmt.Errorf("lease state of %d bytes exceeds %d", len(data), leaseStateMax)
	}
	return atomicfile.Write(s.path, wrapState(data), 0o600)
}
