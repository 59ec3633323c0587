// Package ipam hands out the addresses of vipd's IPPools: the pure parts
// (parsing pools, choosing the first free address, matching pools to a
// Service, checking that Services may share an address) and the allocator
// that takes an address by creating the IPAllocation named after it
// (api/v1alpha1), so that the API server's uniqueness of names is what makes
// a claim exclusive. The Service controller ("services") and the Cluster API
// IPAM provider ("ipam") are built on it.
package ipam

import (
	"cmp"
	"fmt"
	"iter"
	"math"
	"math/big"
	"net/netip"
	"slices"
	"strings"
)

// Family is an IP family: 4 or 6.
type Family int

// The two families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// FamilyOf returns the family of a.
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// String is the Kubernetes spelling (spec.ipFamilies).
func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// Range is an inclusive range of addresses of one family.
type Range struct {
	First, Last netip.Addr
}

// Family of the range.
func (r Range) Family() Family { return FamilyOf(r.First) }

// Contains reports whether a is in the range.
func (r Range) Contains(a netip.Addr) bool {
	a = a.Unmap()
	return a.BitLen() == r.First.BitLen() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

func (r Range) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// ParseRange parses one spec.addresses entry: a CIDR ("192.0.2.0/28"; host
// bits are ignored, so "192.0.2.5/28" is the whole /28) or an inclusive
// range of one family ("192.0.2.10-192.0.2.20", "2001:db8::1-2001:db8::9";
// a single address is "a-a" or "a/32"). A range whose first address is
// after its last is refused.
func ParseRange(s string) (Range, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Zone() != "" {
			return Range{}, fmt.Errorf("%q is not a CIDR (192.0.2.0/28, 2001:db8::/120)", s)
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), min(p.Bits(), p.Addr().Unmap().BitLen())).Masked()
		return Range{First: p.Addr(), Last: lastOf(p)}, nil
	}
	first, last, ok := strings.Cut(s, "-")
	if !ok {
		return Range{}, fmt.Errorf("%q is neither a CIDR (192.0.2.0/28) nor a range (192.0.2.10-192.0.2.20)", s)
	}
	a, err1 := netip.ParseAddr(strings.TrimSpace(first))
	b, err2 := netip.ParseAddr(strings.TrimSpace(last))
	if err1 != nil || err2 != nil || a.Zone() != "" || b.Zone() != "" {
		return Range{}, fmt.Errorf("%q is not a range of two addresses (192.0.2.10-192.0.2.20)", s)
	}
	a, b = a.Unmap(), b.Unmap()
	if a.BitLen() != b.BitLen() {
		return Range{}, fmt.Errorf("range %q mixes IPv4 and IPv6", s)
	}
	if a.Compare(b) > 0 {
		return Range{}, fmt.Errorf("range %q starts after it ends", s)
	}
	return Range{First: a, Last: b}, nil
}

// lastOf is the last address of a masked prefix.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for j := 7; j >= 0; j-- {
			if i*8+(7-j) >= bits {
				b[i] |= 1 << j
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Ranges is the parsed spec.addresses of a pool, in spec order.
type Ranges []Range

// ParseRanges parses spec.addresses and refuses overlapping entries.
func ParseRanges(list []string) (Ranges, error) {
	if len(list) == 0 {
		return nil, fmt.Errorf("no addresses")
	}
	out := make(Ranges, 0, len(list))
	for _, s := range list {
		r, err := ParseRange(s)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if a, b, ok := firstOverlap(out, out); ok {
		return nil, fmt.Errorf("entries %s and %s overlap", a, b)
	}
	return out, nil
}

// firstOverlap finds two overlapping ranges, one from xs and one from ys
// (xs and ys may be the same slice: a range does not overlap itself).
func firstOverlap(xs, ys Ranges) (Range, Range, bool) {
	type tagged struct {
		r    Range
		side int
	}
	same := len(xs) > 0 && len(ys) > 0 && &xs[0] == &ys[0]
	all := make([]tagged, 0, len(xs)+len(ys))
	for _, r := range xs {
		all = append(all, tagged{r, 0})
	}
	if !same {
		for _, r := range ys {
			all = append(all, tagged{r, 1})
		}
	}
	slices.SortFunc(all, func(a, b tagged) int {
		if c := cmp.Compare(a.r.First.BitLen(), b.r.First.BitLen()); c != 0 {
			return c
		}
		return a.r.First.Compare(b.r.First)
	})
	// Sweep in address order, remembering per side the range reaching
	// furthest so far (within one family).
	var reach [2]*Range
	for i := range all {
		t := all[i]
		other := 1 - t.side
		if same {
			other = 0
		}
		if o := reach[other]; o != nil && o.First.BitLen() == t.r.First.BitLen() && t.r.First.Compare(o.Last) <= 0 {
			return *o, t.r, true
		}
		if o := reach[t.side]; o == nil || o.First.BitLen() != t.r.First.BitLen() || t.r.Last.Compare(o.Last) > 0 {
			r := t.r
			reach[t.side] = &r
		}
	}
	return Range{}, Range{}, false
}

// Overlaps returns a range of rs overlapping one of other, if any.
func (rs Ranges) Overlaps(other Ranges) (Range, Range, bool) {
	if len(rs) == 0 || len(other) == 0 {
		return Range{}, Range{}, false
	}
	return firstOverlap(rs, other)
}

// Contains reports whether a is in one of the ranges.
func (rs Ranges) Contains(a netip.Addr) bool {
	for _, r := range rs {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// Families lists the families present, in the order they first appear.
func (rs Ranges) Families() []Family {
	var out []Family
	for _, r := range rs {
		if f := r.Family(); !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// Buggy reports whether a is an IPv4 address ending in .0 or .255, which
// some clients and routers treat as network or broadcast addresses.
func Buggy(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() {
		return false
	}
	last := a.As4()[3]
	return last == 0 || last == 255
}

// Candidates yields the addresses of family f in spec order, ascending
// within each entry, skipping buggy addresses when avoidBuggy is set and the
// addresses taken reports. Nothing is materialised: a /64 costs what its
// first free address costs.
func (rs Ranges) Candidates(f Family, avoidBuggy bool, taken func(netip.Addr) bool) iter.Seq[netip.Addr] {
	return func(yield func(netip.Addr) bool) {
		for _, r := range rs {
			if r.Family() != f {
				continue
			}
			for a := r.First; a.IsValid(); a = a.Next() {
				if !(avoidBuggy && Buggy(a)) && (taken == nil || !taken(a)) {
					if !yield(a) {
						return
					}
				}
				if a == r.Last {
					break
				}
			}
		}
	}
}

// FirstFree returns the first candidate (see Candidates), if any.
func (rs Ranges) FirstFree(f Family, avoidBuggy bool, taken func(netip.Addr) bool) (netip.Addr, bool) {
	for a := range rs.Candidates(f, avoidBuggy, taken) {
		return a, true
	}
	return netip.Addr{}, false
}

// Size counts the addresses of the ranges usable for allocation (without
// the buggy ones when avoidBuggy is set), saturating at math.MaxInt64.
func (rs Ranges) Size(avoidBuggy bool) int64 {
	total := new(big.Int)
	for _, r := range rs {
		n := new(big.Int).Sub(toInt(r.Last), toInt(r.First))
		n.Add(n, big.NewInt(1))
		if avoidBuggy && r.First.Is4() {
			a, b := int64(toInt(r.First).Uint64()), int64(toInt(r.Last).Uint64())
			n.Sub(n, big.NewInt(countMod256(a, b, 0)+countMod256(a, b, 255)))
		}
		total.Add(total, n)
	}
	if !total.IsInt64() {
		return math.MaxInt64
	}
	return total.Int64()
}

// countMod256 counts x in [a, b] with x % 256 == r.
func countMod256(a, b, r int64) int64 {
	upTo := func(n int64) int64 { // x in [0, n]
		if n < r {
			return 0
		}
		return (n-r)/256 + 1
	}
	return upTo(b) - upTo(a-1)
}

func toInt(a netip.Addr) *big.Int {
	return new(big.Int).SetBytes(a.AsSlice())
}

// AddSat adds two non-negative counts, saturating at math.MaxInt64.
func AddSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
