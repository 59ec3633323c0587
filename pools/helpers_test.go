package pools

import (
	"encoding/binary"
	"net/netip"
)

// addrN returns base + n.
func addrN(base netip.Addr, n int) netip.Addr {
	b := base.As16()
	v := binary.BigEndian.Uint32(b[12:]) + uint32(n)
	binary.BigEndian.PutUint32(b[12:], v)
	a := netip.AddrFrom16(b)
	if base.Is4() {
		return a.Unmap()
	}
	return a
}
