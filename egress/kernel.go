package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Kernel reads and writes the node's egress state: the nftables table
// through nftables' netlink API, ip rules and routes through rtnetlink.
type Kernel struct {
	nft *nftables.Conn
	nl  *netlink.Handle
}

// NewKernel opens the kernel interfaces of the current network namespace.
func NewKernel() (*Kernel, error) {
	nft, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &Kernel{nft: nft, nl: nl}, nil
}

// NewKernelAt opens the kernel interfaces of the network namespace ns.
func NewKernelAt(ns netns.NsHandle) (*Kernel, error) {
	nft, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &Kernel{nft: nft, nl: nl}, nil
}

// Close releases the netlink sockets.
func (k *Kernel) Close() { k.nl.Close() }

func table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
}

var hookNames = map[nftables.ChainHook]string{
	*nftables.ChainHookPrerouting:  "prerouting",
	*nftables.ChainHookPostrouting: "postrouting",
	*nftables.ChainHookForward:     "forward",
	*nftables.ChainHookInput:       "input",
	*nftables.ChainHookOutput:      "output",
}

var hooks = map[string]*nftables.ChainHook{
	"prerouting":  nftables.ChainHookPrerouting,
	"postrouting": nftables.ChainHookPostrouting,
	"forward":     nftables.ChainHookForward,
}

// Observe reads what vipd owns in the kernel: its table, and the ip rules
// and routes in its range of tables (Settings.Table and the next
// MaxEgressIPs-1).
func (k *Kernel) Observe(s Settings) (Observed, error) {
	var o Observed
	tables, err := k.nft.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return o, fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == TableName {
			o.Table = true
		}
	}
	if o.Table {
		chains, err := k.nft.ListChainsOfTableFamily(nftables.TableFamilyINet)
		if err != nil {
			return o, fmt.Errorf("list nftables chains: %w", err)
		}
		for _, c := range chains {
			if c.Table == nil || c.Table.Name != TableName {
				continue
			}
			key := c.Name + " (regular chain)"
			if c.Hooknum != nil && c.Priority != nil {
				key = fmt.Sprintf("%s %s %s %d", c.Name, c.Type, hookNames[*c.Hooknum], *c.Priority)
			}
			if c.Policy != nil && *c.Policy != nftables.ChainPolicyAccept {
				key += " policy drop"
			}
			rules, err := k.nft.GetRules(table(), c)
			if err != nil {
				return o, fmt.Errorf("list rules of chain %s: %w", c.Name, err)
			}
			oc := ObservedChain{Key: key}
			for _, r := range rules {
				cm, _ := userdata.GetString(r.UserData, userdata.TypeComment)
				oc.Comments = append(oc.Comments, cm)
			}
			o.Chains = append(o.Chains, oc)
		}
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := k.nl.RuleList(fam)
		if err != nil {
			return o, fmt.Errorf("list ip rules: %w", err)
		}
		for _, r := range rules {
			if r.Priority != s.RulePriority || !ownTable(s, r.Table) {
				continue
			}
			ir := IPRule{Family: nlFamily(fam), Priority: r.Priority, Mark: r.Mark, Table: r.Table}
			if r.Mask != nil {
				ir.Mask = *r.Mask
			}
			o.IPRules = append(o.IPRules, ir)
		}
		// One dump of every table (RT_TABLE_UNSPEC), filtered here: a
		// dump per table would walk the node's whole FIB 15 times.
		routes, err := k.nl.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return o, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if ownTable(s, r.Table) {
				o.Routes = append(o.Routes, fromNetlinkRoute(fam, r))
			}
		}
	}
	return o, nil
}

func ownTable(s Settings, t int) bool { return t >= s.Table && t < s.Table+MaxEgressIPs }

func nlFamily(fam int) int {
	if fam == netlink.FAMILY_V4 {
		return 4
	}
	return 6
}

func toNLFamily(f int) int {
	if f == 4 {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// fromNetlinkRoute maps a kernel route to a Route; anything but vipd's
// own forms (a default route via a gateway, or unreachable) keeps a
// marker so that Diff removes it.
func fromNetlinkRoute(fam int, r netlink.Route) Route {
	out := Route{Family: nlFamily(fam), Table: r.Table}
	isDefault := r.Dst == nil || (r.Dst.IP.IsUnspecified() && maskOnes(r.Dst.Mask) == 0)
	switch {
	case r.Type == unix.RTN_UNREACHABLE && isDefault:
		return out
	case isDefault && r.Gw != nil:
		a, _ := netip.AddrFromSlice(r.Gw)
		out.Via, out.Link = a.Unmap(), r.LinkIndex
	case isDefault && r.Via != nil:
		if v, ok := r.Via.(*netlink.Via); ok {
			a, _ := netip.AddrFromSlice(v.Addr)
			out.Via, out.Link = a.Unmap(), r.LinkIndex
		}
	}
	if !out.Via.IsValid() {
		// Not a form vipd makes (a route someone added to its table):
		// Link -1 never matches a wanted route, so it is deleted.
		out.Link = -1
		out.raw = &r
	}
	return out
}

func maskOnes(m net.IPMask) int {
	ones, _ := m.Size()
	return ones
}

// Apply carries out c, reaching want: new rules and routes first, then the
// nftables table (replaced whole, in one batch), then the deletions.
func (k *Kernel) Apply(want State, c Changes) error {
	var errs []error
	for _, r := range c.AddRules {
		if err := k.nl.RuleAdd(toNetlinkRule(r)); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("add ip rule %s: %w", r, err))
		}
	}
	for _, r := range c.AddRoutes {
		nr := toNetlinkRoute(r)
		if err := k.nl.RouteReplace(nr); err != nil {
			errs = append(errs, fmt.Errorf("add route %s: %w", r, err))
		}
	}
	if c.ReplaceTable {
		if err := k.replaceTable(want.Chains); err != nil {
			errs = append(errs, err)
		}
	}
	if c.DeleteTable {
		if err := k.deleteTable(); err != nil {
			errs = append(errs, err)
		}
	}
	// Each table holds one default route: an added route replaced the
	// old one already (deleting it now would delete the new one: IPv6
	// matches a delete by destination, not by type).
	replaced := map[[2]int]bool{}
	for _, r := range c.AddRoutes {
		replaced[[2]int{r.Family, r.Table}] = true
	}
	for _, r := range c.DelRoutes {
		nr := toNetlinkRoute(r)
		if raw, ok := r.raw.(*netlink.Route); ok {
			nr = raw
		} else if replaced[[2]int{r.Family, r.Table}] {
			continue
		}
		if err := k.nl.RouteDel(nr); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r, err))
		}
	}
	for _, r := range c.DelRules {
		if err := k.nl.RuleDel(toNetlinkRule(r)); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete ip rule %s: %w", r, err))
		}
	}
	return errors.Join(errs...)
}

// Remove deletes everything vipd owns (Observe's view of it): on stop, and
// at start-up for what a crash left behind. It returns what it removed.
func (k *Kernel) Remove(s Settings) (Changes, error) {
	obs, err := k.Observe(s)
	if err != nil {
		return Changes{}, err
	}
	c := Diff(State{}, obs)
	return c, k.Apply(State{}, c)
}

// Arrivals returns the packets counted by the stopping state's arrivals
// chain (selected flows from other nodes), summed over its rules; 0
// without that chain.
func (k *Kernel) Arrivals() (uint64, error) {
	rules, err := k.nft.GetRules(table(), &nftables.Chain{Name: ChainArrivals, Table: table()})
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, fmt.Errorf("read the counters of chain %s: %w", ChainArrivals, err)
	}
	var n uint64
	for _, r := range rules {
		cm, _ := userdata.GetString(r.UserData, userdata.TypeComment)
		if !strings.HasPrefix(cm, "vipd stopping") {
			continue
		}
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				n += c.Packets
			}
		}
	}
	return n, nil
}

func (k *Kernel) deleteTable() error {
	t := table()
	// Adding first makes the delete succeed whether or not it exists.
	k.nft.AddTable(t)
	k.nft.DelTable(t)
	if err := k.nft.Flush(); err != nil {
		return fmt.Errorf("delete nftables table %s: %w", TableName, err)
	}
	return nil
}

// replaceTable deletes and recreates the table with chains in one
// netlink batch: the kernel applies it atomically, so no packet sees a
// half-written table.
func (k *Kernel) replaceTable(chains []Chain) error {
	t := table()
	k.nft.AddTable(t)
	k.nft.DelTable(t)
	t = k.nft.AddTable(table())
	accept := nftables.ChainPolicyAccept
	for _, c := range chains {
		typ := nftables.ChainTypeFilter
		if c.Type == "nat" {
			typ = nftables.ChainTypeNAT
		}
		ch := k.nft.AddChain(&nftables.Chain{Name: c.Name, Table: t, Type: typ, Hooknum: hooks[c.Hook],
			Priority: nftables.ChainPriorityRef(nftables.ChainPriority(c.Priority)), Policy: &accept})
		for _, r := range c.Rules {
			k.nft.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: ruleExprs(r),
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.Comment())})
		}
	}
	if err := k.nft.Flush(); err != nil {
		return fmt.Errorf("replace nftables table %s: %w", TableName, err)
	}
	return nil
}

func toNetlinkRule(r IPRule) *netlink.Rule {
	nr := netlink.NewRule()
	nr.Family = toNLFamily(r.Family)
	nr.Priority = r.Priority
	nr.Table = r.Table
	nr.Mark = r.Mark
	mask := r.Mask
	nr.Mask = &mask
	return nr
}

func toNetlinkRoute(r Route) *netlink.Route {
	dst := &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	if r.Family == 6 {
		dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	nr := &netlink.Route{Family: toNLFamily(r.Family), Table: r.Table, Dst: dst}
	switch {
	case r.Unreachable():
		nr.Type = unix.RTN_UNREACHABLE
	default:
		nr.Gw = net.IP(r.Via.AsSlice())
		nr.LinkIndex = r.Link
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	return nr
}

// Expressions: register 1 holds what is compared.

func nfproto(f int) []expr.Any {
	p := byte(unix.NFPROTO_IPV4)
	if f == 6 {
		p = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func addrOffset(f int, src bool) (offset, length uint32) {
	switch {
	case f == 4 && src:
		return 12, 4
	case f == 4:
		return 16, 4
	case src:
		return 8, 16
	default:
		return 24, 16
	}
}

func prefixMatch(f int, src bool, p netip.Prefix) []expr.Any {
	if !p.IsValid() || p.Bits() == 0 {
		return nil
	}
	off, l := addrOffset(f, src)
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l}}
	if p.Bits() < p.Addr().BitLen() {
		mask := net.CIDRMask(p.Bits(), p.Addr().BitLen())
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: l, Mask: mask, Xor: make([]byte, l)})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()})
}

func ruleExprs(r NftRule) []expr.Any {
	e := nfproto(r.Family)
	if r.DNATed {
		e = append(e,
			&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(0x20 /* IPS_DST_NAT */), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
	}
	if r.DstLocal {
		e = append(e,
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
	}
	if r.Reply {
		e = append(e,
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
	}
	if r.Iif != 0 {
		e = append(e,
			&expr.Meta{Key: expr.MetaKeyIIF, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(uint32(r.Iif))})
	}
	e = append(e, prefixMatch(r.Family, true, r.Src)...)
	e = append(e, prefixMatch(r.Family, false, r.Dst)...)
	if r.MarkMask != 0 {
		e = append(e,
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(r.MarkMask), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(r.Mark)})
	}
	e = append(e, &expr.Counter{})
	natFamily := uint32(unix.NFPROTO_IPV4)
	if r.Family == 6 {
		natFamily = unix.NFPROTO_IPV6
	}
	switch r.Action.Kind {
	case Return:
		e = append(e, &expr.Verdict{Kind: expr.VerdictReturn})
	case Accept:
		e = append(e, &expr.Verdict{Kind: expr.VerdictAccept})
	case Drop:
		e = append(e, &expr.Verdict{Kind: expr.VerdictDrop})
	case Count:
		// The counter above is all.
	case SetMark:
		e = append(e,
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(^r.Action.Mask), Xor: binaryutil.NativeEndian.PutUint32(r.Action.Mark)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
	case SNAT:
		e = append(e,
			&expr.Immediate{Register: 1, Data: r.Action.To.AsSlice()},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: natFamily, RegAddrMin: 1})
	case SNATSelf:
		off, l := addrOffset(r.Family, true)
		e = append(e,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: natFamily, RegAddrMin: 1})
	}
	return e
}
