package migrate

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// kvPeer is one BGP neighbour as kube-vip describes it.
type kvPeer struct {
	Address    string // IP address, empty for unnumbered peers
	Unnumbered string // interface name of an "unnumbered:<iface>" peer
	AS         uint32
	Password   string
	Multihop   bool
	Port       uint16 // 0: default 179
	MPBGP      string // raw MP-BGP options, unsupported by vipd
	BFD        bool
	BFDRx      uint32 // milliseconds
	BFDTx      uint32 // milliseconds
	BFDMult    uint32
}

// parseKubeVIPPeers parses kube-vip's bgp_peers grammar:
//
//	<address>:<AS>[:<password>[:<multihop>[:<port>[:<mpbgp k=v;...>[:<bfd enable;rx;tx;mult>]]]]]
//
// comma separated, IPv6 addresses in brackets, or "unnumbered:<iface>" in
// place of the address. It is an independent implementation of the format
// kube-vip documents; errors name the entry.
func parseKubeVIPPeers(s string) ([]kvPeer, error) {
	var out []kvPeer
	for i, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		p, err := parseKubeVIPPeer(entry)
		if err != nil {
			return nil, fmt.Errorf("bgp_peers entry %d %q: %w (accepted form: address:as[:password[:multihop[:port[:mpbgp[:bfd;rx;tx;mult]]]]], IPv6 as [addr])", i+1, redactKubeVIPPeer(entry), err)
		}
		out = append(out, p)
	}
	return out, nil
}

func parseKubeVIPPeer(entry string) (kvPeer, error) {
	var p kvPeer
	rest := entry
	switch {
	case strings.HasPrefix(rest, "["):
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return p, fmt.Errorf("missing ] after IPv6 address")
		}
		p.Address = rest[1:end]
		rest = rest[end+1:]
		if rest != "" && rest[0] != ':' {
			return p, fmt.Errorf("expected : after ]")
		}
		rest = strings.TrimPrefix(rest, ":")
	case strings.HasPrefix(rest, "unnumbered:"):
		rest = strings.TrimPrefix(rest, "unnumbered:")
		iface, after, _ := strings.Cut(rest, ":")
		if iface == "" {
			return p, fmt.Errorf("unnumbered peer without an interface name")
		}
		p.Unnumbered = iface
		rest = after
	default:
		addr, after, found := strings.Cut(rest, ":")
		if !found {
			return p, fmt.Errorf("missing :AS after the address")
		}
		p.Address = addr
		rest = after
	}
	if p.Unnumbered == "" {
		if p.Address == "" {
			return p, fmt.Errorf("missing address")
		}
		a, err := netip.ParseAddr(p.Address)
		if err != nil {
			return p, fmt.Errorf("address %q is not an IP address", p.Address)
		}
		if a.Zone() != "" {
			return p, fmt.Errorf("address %q has a zone; vipd peers need a global address", p.Address)
		}
		p.Address = a.String()
	}
	fields := strings.Split(rest, ":")
	get := func(i int) string {
		if i < len(fields) {
			return fields[i]
		}
		return ""
	}
	if len(fields) > 6 {
		return p, fmt.Errorf("%d fields after the address, at most 6 expected", len(fields))
	}
	if get(0) == "" {
		if p.Unnumbered == "" {
			return p, fmt.Errorf("missing AS number")
		}
	} else {
		as, err := strconv.ParseUint(get(0), 10, 32)
		if err != nil || as == 0 {
			return p, fmt.Errorf("AS %q is not a number from 1 to 4294967295", get(0))
		}
		p.AS = uint32(as)
	}
	p.Password = get(1)
	if v := get(2); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return p, fmt.Errorf("multihop %q is not true or false", v)
		}
		p.Multihop = b
	}
	if v := get(3); v != "" {
		port, err := strconv.ParseUint(v, 10, 16)
		if err != nil || port == 0 {
			return p, fmt.Errorf("port %q is not a number from 1 to 65535", v)
		}
		p.Port = uint16(port)
	}
	p.MPBGP = get(4)
	if v := get(5); v != "" {
		parts := strings.Split(v, ";")
		if len(parts) != 4 {
			return p, fmt.Errorf("BFD options %q: want enable;rx;tx;multiplier", v)
		}
		b, err := strconv.ParseBool(parts[0])
		if err != nil {
			return p, fmt.Errorf("BFD enable %q is not true or false", parts[0])
		}
		p.BFD = b
		p.BFDRx, p.BFDTx, p.BFDMult = 300, 300, 3
		for i, dst := range []*uint32{&p.BFDRx, &p.BFDTx, &p.BFDMult} {
			if parts[i+1] == "" {
				continue
			}
			n, err := strconv.ParseUint(parts[i+1], 10, 32)
			if err != nil || n == 0 {
				return p, fmt.Errorf("BFD value %q is not a positive number", parts[i+1])
			}
			*dst = uint32(n)
		}
	}
	return p, nil
}

// vipdPeer is one entry of VIPD_BGP_PEERS.
type vipdPeer struct {
	Address  string
	AS       uint32
	Port     uint16
	Password string
	Multihop uint8 // TTL; 0: directly connected
	HoldSec  uint64
	KeepSec  uint64
}

// String formats the peer in VIPD_BGP_PEERS syntax:
// address:as[:option=value...], IPv6 addresses in brackets.
func (p vipdPeer) String() string {
	var b strings.Builder
	a, err := netip.ParseAddr(p.Address)
	if err == nil && a.Is6() && !a.Is4In6() {
		b.WriteString("[" + p.Address + "]")
	} else {
		b.WriteString(p.Address)
	}
	fmt.Fprintf(&b, ":%d", p.AS)
	if p.Port != 0 && p.Port != 179 {
		fmt.Fprintf(&b, ":port=%d", p.Port)
	}
	if p.Multihop != 0 {
		fmt.Fprintf(&b, ":multihop=%d", p.Multihop)
	}
	if p.HoldSec != 0 {
		fmt.Fprintf(&b, ":hold=%ds", p.HoldSec)
	}
	if p.KeepSec != 0 {
		fmt.Fprintf(&b, ":keepalive=%ds", p.KeepSec)
	}
	if p.Password != "" {
		fmt.Fprintf(&b, ":password=%s", p.Password)
	}
	return b.String()
}

// redactKubeVIPPeers hides the password field of every entry of a kube-vip
// bgp_peers value, for warnings and errors.
func redactKubeVIPPeers(s string) string {
	entries := strings.Split(s, ",")
	for i, e := range entries {
		entries[i] = redactKubeVIPPeer(e)
	}
	return strings.Join(entries, ",")
}

// redactKubeVIPPeer hides the password of one bgp_peers entry: the field
// after the AS (address:as:password:..., [v6]:as:password:...,
// unnumbered:iface:as:password:...).
func redactKubeVIPPeer(entry string) string {
	head, rest := "", entry
	switch {
	case strings.HasPrefix(entry, "["):
		end := strings.IndexByte(entry, ']')
		if end < 0 {
			return entry
		}
		head, rest = entry[:end+1], entry[end+1:]
		if !strings.HasPrefix(rest, ":") {
			return entry
		}
		head, rest = head+":", rest[1:]
	case strings.HasPrefix(entry, "unnumbered:"):
		iface, after, _ := strings.Cut(strings.TrimPrefix(entry, "unnumbered:"), ":")
		head, rest = "unnumbered:"+iface+":", after
	default:
		addr, after, found := strings.Cut(entry, ":")
		if !found {
			return entry
		}
		head, rest = addr+":", after
	}
	fields := strings.Split(rest, ":") // as, password, ...
	if len(fields) > 1 && fields[1] != "" {
		fields[1] = "<redacted>"
	}
	return head + strings.Join(fields, ":")
}
