package bgp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// PeersFileEnv is the setting naming the YAML peers file.
const PeersFileEnv = "VIPD_BGP_PEERS_FILE"

// PeersFileForm is the accepted form, for errors.
const PeersFileForm = "a YAML file with 'peers:' (a list of address, as, and optional port, password_file, multihop, hold, keepalive) " +
	"and optional 'vips:' (VIP prefix -> communities, large_communities, local_pref, med, as_path_prepend); see docs/bgp.md"

// maxPasswordFile bounds what ReadPasswordFile reads: a TCP MD5 key is at
// most 80 bytes, so anything much larger is the wrong file.
const maxPasswordFile = 4096

type filePeer struct {
	Address      string `yaml:"address"`
	AS           uint32 `yaml:"as"`
	Port         uint16 `yaml:"port"`
	PasswordFile string `yaml:"password_file"`
	Multihop     uint8  `yaml:"multihop"`
	Hold         string `yaml:"hold"`
	Keepalive    string `yaml:"keepalive"`
}

type fileAttrs struct {
	Communities      []string `yaml:"communities"`
	LargeCommunities []string `yaml:"large_communities"`
	LocalPref        *uint32  `yaml:"local_pref"`
	MED              *uint32  `yaml:"med"`
	Prepend          uint8    `yaml:"as_path_prepend"`
}

type peersFile struct {
	Peers []filePeer           `yaml:"peers"`
	VIPs  map[string]fileAttrs `yaml:"vips"`
	_     struct{}             `yaml:"-"`
}

// PeersFile is the content of a peers file.
type PeersFile struct {
	Peers         []Peer
	VIPAttributes map[netip.Prefix]Attributes
}

// LoadPeersFile reads and checks a YAML peers file. Errors name the
// setting and the file, never a password.
func LoadPeersFile(path string) (PeersFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return PeersFile{}, fmt.Errorf("%s: %w; want %s", PeersFileEnv, err, PeersFileForm)
	}
	pf, err := ParsePeersFile(b)
	if err != nil {
		return PeersFile{}, fmt.Errorf("%s: %s: %w; want %s", PeersFileEnv, path, err, PeersFileForm)
	}
	return pf, nil
}

// ParsePeersFile parses the YAML text of a peers file. Unknown keys are
// errors, so a misspelt option is never silently ignored.
func ParsePeersFile(b []byte) (PeersFile, error) {
	var f peersFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return PeersFile{}, errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	out := PeersFile{VIPAttributes: map[netip.Prefix]Attributes{}}
	seen := map[netip.Addr]bool{}
	for i, fp := range f.Peers {
		p, err := fp.peer()
		if err != nil {
			return PeersFile{}, fmt.Errorf("peers[%d] (%s): %w", i, fp.Address, err)
		}
		if seen[p.Address] {
			return PeersFile{}, fmt.Errorf("peers[%d]: peer %s appears twice; want each router address once", i, p.Address)
		}
		seen[p.Address] = true
		out.Peers = append(out.Peers, p)
	}
	if len(out.Peers) == 0 {
		return PeersFile{}, errors.New("no peers")
	}
	for k, fa := range f.VIPs {
		pfx, err := netip.ParsePrefix(k)
		if err != nil {
			return PeersFile{}, fmt.Errorf("vips: %q is not a prefix", k)
		}
		vip, err := checkVIP(pfx)
		if err != nil {
			return PeersFile{}, fmt.Errorf("vips: %q: want a single address (/32 or /128)", k)
		}
		a, err := fa.attributes()
		if err != nil {
			return PeersFile{}, fmt.Errorf("vips: %s: %w", k, err)
		}
		out.VIPAttributes[vip] = a
	}
	return out, nil
}

func (fp filePeer) peer() (Peer, error) {
	var p Peer
	a, err := netip.ParseAddr(fp.Address)
	if err != nil {
		return p, fmt.Errorf("address %q is not an IP address", fp.Address)
	}
	p.Address, p.AS, p.Port, p.Multihop = a.Unmap(), fp.AS, fp.Port, fp.Multihop
	if fp.PasswordFile != "" {
		if !strings.HasPrefix(fp.PasswordFile, "/") {
			return p, fmt.Errorf("password_file %q: want an absolute path", fp.PasswordFile)
		}
		p.PasswordFile = fp.PasswordFile
	}
	if fp.Hold != "" {
		if p.Hold, err = parseSeconds(fp.Hold); err != nil {
			return p, fmt.Errorf("hold %q: %w", fp.Hold, err)
		}
	}
	if fp.Keepalive != "" {
		if p.Keepalive, err = parseSeconds(fp.Keepalive); err != nil {
			return p, fmt.Errorf("keepalive %q: %w", fp.Keepalive, err)
		}
	}
	fillTimers(&p, fp.Hold != "", fp.Keepalive != "")
	if err := p.validate(); err != nil {
		return p, err
	}
	return p, nil
}

func (fa fileAttrs) attributes() (Attributes, error) {
	var a Attributes
	var err error
	if fa.Communities != nil {
		if a.Communities, err = ParseCommunities(strings.Join(fa.Communities, ",")); err != nil {
			return a, err
		}
		if a.Communities == nil {
			a.Communities = []uint32{} // an explicit empty list drops the node's
		}
	}
	if fa.LargeCommunities != nil {
		if a.LargeCommunities, err = ParseLargeCommunities(strings.Join(fa.LargeCommunities, ",")); err != nil {
			return a, err
		}
		if a.LargeCommunities == nil {
			a.LargeCommunities = []LargeCommunity{}
		}
	}
	a.LocalPref, a.MED, a.Prepend = fa.LocalPref, fa.MED, fa.Prepend
	return a, a.validate()
}

// ReadPasswordFile reads a TCP MD5 password from path: the whole file,
// any bytes, less one trailing newline (LF or CRLF). Errors name the file
// and never the content.
func ReadPasswordFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("password file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPasswordFile+1))
	if err != nil {
		return "", fmt.Errorf("password file %s: %w", path, err)
	}
	if len(b) > maxPasswordFile {
		return "", fmt.Errorf("password file %s: larger than %d bytes; want the password alone", path, maxPasswordFile)
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	switch {
	case pw == "":
		return "", fmt.Errorf("password file %s is empty; want the password (1-80 bytes)", path)
	case len(pw) > 80:
		return "", fmt.Errorf("password file %s: password is %d bytes; want 1-80 (TCP MD5 limit)", path, len(pw))
	}
	return pw, nil
}

// ResolvePasswords reads each peer's PasswordFile into its Password. The
// error names the setting and the peer, never a password.
func ResolvePasswords(peers []Peer, setting string) error {
	for i := range peers {
		if peers[i].PasswordFile == "" {
			continue
		}
		pw, err := ReadPasswordFile(peers[i].PasswordFile)
		if err != nil {
			return fmt.Errorf("%s: peer %s: %w", setting, peers[i].Address, err)
		}
		peers[i].Password = pw
	}
	return nil
}
