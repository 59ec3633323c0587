package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	api "github.com/osrg/gobgp/v3/api"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// MaxPrepend bounds VIPD_BGP_AS_PATH_PREPEND: more copies of the local AS
// buy nothing over a few and some routers cap the AS path length.
const MaxPrepend = 10

// LargeCommunity is an RFC 8092 large community, global:local1:local2.
type LargeCommunity struct {
	Global, Local1, Local2 uint32
}

func (c LargeCommunity) String() string {
	return fmt.Sprintf("%d:%d:%d", c.Global, c.Local1, c.Local2)
}

// Attributes are the path attributes vipd sets on a VIP's route. The zero
// value sets none: the route carries ORIGIN, AS_PATH and NEXT_HOP only.
type Attributes struct {
	// Communities are RFC 1997 communities, each AS<<16 | value.
	Communities []uint32
	// LargeCommunities are RFC 8092 large communities.
	LargeCommunities []LargeCommunity
	// LocalPref, when set, is sent to iBGP peers (eBGP peers never see it:
	// RFC 4271 5.1.5). Higher is preferred.
	LocalPref *uint32
	// MED, when set, is the MULTI_EXIT_DISC. Lower is preferred, compared
	// by the router between paths from the same neighbouring AS.
	MED *uint32
	// Prepend is how many extra copies of the local AS go in front of the
	// AS path (0-MaxPrepend). A longer path is less preferred.
	Prepend uint8
}

// IsZero reports whether a sets nothing.
func (a Attributes) IsZero() bool {
	return len(a.Communities) == 0 && len(a.LargeCommunities) == 0 && a.LocalPref == nil && a.MED == nil && a.Prepend == 0
}

// Over returns a with every field that o sets replaced by o's: a per-VIP
// override over the node's defaults. A per-VIP community list replaces the
// node's list rather than adding to it, so a VIP can also drop them.
func (a Attributes) Over(o Attributes) Attributes {
	if o.Communities != nil {
		a.Communities = o.Communities
	}
	if o.LargeCommunities != nil {
		a.LargeCommunities = o.LargeCommunities
	}
	if o.LocalPref != nil {
		a.LocalPref = o.LocalPref
	}
	if o.MED != nil {
		a.MED = o.MED
	}
	if o.Prepend != 0 {
		a.Prepend = o.Prepend
	}
	return a
}

// String is a compact description for logs.
func (a Attributes) String() string {
	var parts []string
	if len(a.Communities) > 0 {
		cs := make([]string, len(a.Communities))
		for i, c := range a.Communities {
			cs[i] = communityText(c)
		}
		parts = append(parts, "communities="+strings.Join(cs, " "))
	}
	if len(a.LargeCommunities) > 0 {
		cs := make([]string, len(a.LargeCommunities))
		for i, c := range a.LargeCommunities {
			cs[i] = c.String()
		}
		parts = append(parts, "large-communities="+strings.Join(cs, " "))
	}
	if a.LocalPref != nil {
		parts = append(parts, fmt.Sprintf("local-pref=%d", *a.LocalPref))
	}
	if a.MED != nil {
		parts = append(parts, fmt.Sprintf("med=%d", *a.MED))
	}
	if a.Prepend > 0 {
		parts = append(parts, fmt.Sprintf("prepend=%d", a.Prepend))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// Well-known communities (RFC 1997, RFC 3765, RFC 8326) by name.
var wellKnownCommunities = []struct {
	name string
	v    uint32
}{
	{"graceful-shutdown", 0xFFFF0000},
	{"blackhole", 0xFFFF029A},
	{"no-export", 0xFFFFFF01},
	{"no-advertise", 0xFFFFFF02},
	{"no-export-subconfed", 0xFFFFFF03},
	{"no-peer", 0xFFFFFF04},
}

func communityText(c uint32) string {
	for _, w := range wellKnownCommunities {
		if w.v == c {
			return w.name
		}
	}
	return fmt.Sprintf("%d:%d", c>>16, c&0xFFFF)
}

// CommunitiesForm is the accepted form of a community list.
const CommunitiesForm = "a comma list of AS:value (each 0-65535) or well-known names (no-export, no-advertise, no-export-subconfed, no-peer, graceful-shutdown, blackhole)"

// LargeCommunitiesForm is the accepted form of a large-community list.
const LargeCommunitiesForm = "a comma list of global:local1:local2 (each 0-4294967295)"

// ParseCommunities parses a comma (or space) separated community list.
// Duplicates are dropped; the order is kept.
func ParseCommunities(s string) ([]uint32, error) {
	var out []uint32
	for _, item := range splitList(s) {
		v, err := parseCommunity(item)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out, nil
}

func parseCommunity(item string) (uint32, error) {
	for _, w := range wellKnownCommunities {
		if strings.EqualFold(item, w.name) {
			return w.v, nil
		}
	}
	hi, lo, ok := strings.Cut(item, ":")
	if !ok {
		return 0, fmt.Errorf("community %q: want AS:value or a well-known name", item)
	}
	a, err1 := strconv.ParseUint(hi, 10, 16)
	b, err2 := strconv.ParseUint(lo, 10, 16)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("community %q: both halves must be 0-65535", item)
	}
	return uint32(a)<<16 | uint32(b), nil
}

// ParseLargeCommunities parses a comma (or space) separated list of large
// communities. Duplicates are dropped; the order is kept.
func ParseLargeCommunities(s string) ([]LargeCommunity, error) {
	var out []LargeCommunity
	for _, item := range splitList(s) {
		f := strings.Split(item, ":")
		if len(f) != 3 {
			return nil, fmt.Errorf("large community %q: want global:local1:local2", item)
		}
		var v [3]uint32
		for i, x := range f {
			n, err := strconv.ParseUint(x, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("large community %q: each part must be 0-4294967295", item)
			}
			v[i] = uint32(n)
		}
		c := LargeCommunity{v[0], v[1], v[2]}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
}

// ParseUint32 parses an optional 32-bit value (local preference, MED):
// empty is unset.
func ParseUint32(s string) (*uint32, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return nil, errors.New("want a whole number 0-4294967295")
	}
	v := uint32(n)
	return &v, nil
}

func (a Attributes) validate() error {
	if a.Prepend > MaxPrepend {
		return fmt.Errorf("AS path prepend %d: want 0-%d", a.Prepend, MaxPrepend)
	}
	return nil
}

// pattrs returns the extra path attributes for a locally originated path
// of the speaker with AS localAS.
func (a Attributes) pattrs(localAS uint32) ([]*anypb.Any, error) {
	var out []*anypb.Any
	add := func(m proto.Message) error {
		x, err := anypb.New(m)
		if err != nil {
			return err
		}
		out = append(out, x)
		return nil
	}
	if a.Prepend > 0 {
		// GoBGP puts the local AS in front once more when it sends the path
		// to an eBGP peer, so the router sees Prepend+1 copies; an iBGP
		// peer sees Prepend.
		nums := make([]uint32, a.Prepend)
		for i := range nums {
			nums[i] = localAS
		}
		if err := add(&api.AsPathAttribute{Segments: []*api.AsSegment{{Type: api.AsSegment_AS_SEQUENCE, Numbers: nums}}}); err != nil {
			return nil, err
		}
	}
	if a.MED != nil {
		if err := add(&api.MultiExitDiscAttribute{Med: *a.MED}); err != nil {
			return nil, err
		}
	}
	if a.LocalPref != nil {
		if err := add(&api.LocalPrefAttribute{LocalPref: *a.LocalPref}); err != nil {
			return nil, err
		}
	}
	if len(a.Communities) > 0 {
		if err := add(&api.CommunitiesAttribute{Communities: a.Communities}); err != nil {
			return nil, err
		}
	}
	if len(a.LargeCommunities) > 0 {
		lc := make([]*api.LargeCommunity, len(a.LargeCommunities))
		for i, c := range a.LargeCommunities {
			lc[i] = &api.LargeCommunity{GlobalAdmin: c.Global, LocalData1: c.Local1, LocalData2: c.Local2}
		}
		if err := add(&api.LargeCommunitiesAttribute{Communities: lc}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// attributesFor is the node's attributes with vip's override applied.
func (c Config) attributesFor(vip netip.Prefix) Attributes {
	a := c.Attributes
	if o, ok := c.VIPAttributes[vip]; ok {
		a = a.Over(o)
	}
	return a
}
