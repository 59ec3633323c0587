package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/vipd/vipd/internal/atomicfile"
)

// MembersFile is the name of the persisted member list in the state
// directory.
const MembersFile = "members.json"

// Known is the persisted set of members ever seen.
type Known struct {
	Members map[string]KnownMember `json:"members"`
	// Left are the members that left gracefully and are no longer counted;
	// one that comes back is counted again at once (see Election). Older
	// versions ignore this list.
	Left map[string]KnownMember `json:"left,omitempty"`
}

// KnownMember is one remembered member.
type KnownMember struct {
	Addr      string    `json:"addr,omitempty"`
	FirstSeen time.Time `json:"first_seen"`
	LeftAt    time.Time `json:"left_at,omitzero"` // in Known.Left
}

// Names returns the remembered member names, sorted.
func (k Known) Names() []string {
	out := make([]string, 0, len(k.Members))
	for n := range k.Members {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// LoadKnown reads the member list from dir; a missing file is an empty list.
func LoadKnown(dir string) (Known, time.Time, error) {
	k := Known{Members: map[string]KnownMember{}}
	p := filepath.Join(dir, MembersFile)
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return k, time.Time{}, nil
	}
	if err != nil {
		return k, time.Time{}, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return k, time.Time{}, err
	}
	if err := json.Unmarshal(b, &k); err != nil {
		return k, time.Time{}, fmt.Errorf("%s: %w", p, err)
	}
	if k.Members == nil {
		k.Members = map[string]KnownMember{}
	}
	return k, st.ModTime(), nil
}

// SaveKnown writes the member list atomically and returns its new mtime.
func SaveKnown(dir string, k Known) (time.Time, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return time.Time{}, fmt.Errorf("VIPD_STATE_DIR %s: %w", dir, err)
	}
	b, err := json.MarshalIndent(k, "", "  ")
	if err != nil {
		return time.Time{}, err
	}
	p := filepath.Join(dir, MembersFile)
	if err := atomicfile.Write(p, append(b, '\n'), 0o640); err != nil {
		return time.Time{}, err
	}
	st, err := os.Stat(p)
	if err != nil {
		return time.Time{}, err
	}
	return st.ModTime(), nil
}

// Forget removes a member from the persisted list for good (it is added
// back if it joins again). It reports whether the member was known.
func Forget(dir, name string) (bool, error) {
	k, _, err := LoadKnown(dir)
	if err != nil {
		return false, err
	}
	_, member := k.Members[name]
	_, left := k.Left[name]
	if !member && !left {
		return false, nil
	}
	delete(k.Members, name)
	delete(k.Left, name) // not counted again when it comes back
	_, err = SaveKnown(dir, k)
	return true, err
}
