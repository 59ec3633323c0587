package vip

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

func TestLinkDownReason(t *testing.T) {
	tests := []struct {
		name  string
		flags net.Flags
		raw   uint32
		oper  netlink.LinkOperState
		want  string
	}{
		{"up", net.FlagUp, unix.IFF_UP | unix.IFF_LOWER_UP, netlink.OperUp, ""},
		{"admin down", 0, 0, netlink.OperDown, "administratively down"},
		{"admin down but oper up reported", 0, unix.IFF_LOWER_UP, netlink.OperUp, "administratively down"},
		{"no carrier (veth peer down)", net.FlagUp, unix.IFF_UP, netlink.OperDown, "operationally down"},
		{"lower layer down (vlan on a down parent)", net.FlagUp, unix.IFF_UP, netlink.OperLowerLayerDown, "operationally lower-layer-down"},
		{"dormant", net.FlagUp, unix.IFF_UP | unix.IFF_LOWER_UP, netlink.OperDormant, "operationally dormant"},
		{"unknown with carrier (dummy)", net.FlagUp, unix.IFF_UP | unix.IFF_LOWER_UP, netlink.OperUnknown, ""},
		{"unknown without carrier", net.FlagUp, unix.IFF_UP, netlink.OperUnknown, "without carrier"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := linkDownReason(&netlink.LinkAttrs{Flags: tt.flags, RawFlags: tt.raw, OperState: tt.oper})
			if got != tt.want {
				t.Fatalf("linkDownReason = %q, want %q", got, tt.want)
			}
		})
	}
}

var (
	ownMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	otherMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	thirdMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x03}
)

// frame builds an Ethernet frame carrying an ICMPv6 NDP message.
func frame(t *testing.T, src net.HardwareAddr, m ndp.Message) []byte {
	t.Helper()
	body, err := ndp.MarshalMessage(m)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 14+40, 14+40+len(body))
	copy(b[0:6], ethernet.Broadcast)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], unix.ETH_P_IPV6)
	b[14] = 0x60
	binary.BigEndian.PutUint16(b[14+4:], uint16(len(body)))
	b[14+6] = unix.IPPROTO_ICMPV6
	b[14+7] = 255
	srcIP := netip.MustParseAddr("fe80::2").As16()
	copy(b[14+8:], srcIP[:])
	dst := netip.IPv6LinkLocalAllNodes().As16()
	copy(b[14+24:], dst[:])
	return append(b, body...)
}

func na(target netip.Addr, tlla net.HardwareAddr) *ndp.NeighborAdvertisement {
	m := &ndp.NeighborAdvertisement{Solicited: true, Override: true, TargetAddress: target}
	if tlla != nil {
		m.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: tlla}}
	}
	return m
}

func TestNAClaim(t *testing.T) {
	vip := netip.MustParseAddr("fd00::100")
	other := netip.MustParseAddr("fd00::101")
	tests := []struct {
		name  string
		frame []byte
		want  net.HardwareAddr
	}{
		{"another host advertises the VIP", frame(t, otherMAC, na(vip, otherMAC)), otherMAC},
		{"no target link-layer option: the frame's source", frame(t, otherMAC, na(vip, nil)), otherMAC},
		{"a proxy advertising a third MAC", frame(t, otherMAC, na(vip, thirdMAC)), thirdMAC},
		{"our own frame", frame(t, ownMAC, na(vip, ownMAC)), nil},
		{"our own frame without option", frame(t, ownMAC, na(vip, nil)), nil},
		{"another sender naming our MAC", frame(t, otherMAC, na(vip, ownMAC)), nil},
		{"another address", frame(t, otherMAC, na(other, otherMAC)), nil},
		{"a solicitation, not an advertisement", frame(t, otherMAC, &ndp.NeighborSolicitation{TargetAddress: vip}), nil},
		{"zero MAC", frame(t, otherMAC, na(vip, make(net.HardwareAddr, 6))), nil},
		{"truncated", frame(t, otherMAC, na(vip, otherMAC))[:50], nil},
		{"empty", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := naClaim(tt.frame, vip, ownMAC)
			if got.String() != tt.want.String() {
				t.Fatalf("naClaim = %q, want %q", got, tt.want)
			}
			if tt.want != nil && len(got) == 0 {
				t.Fatal("a conflict must name a MAC")
			}
		})
	}
}

func TestNAFilter(t *testing.T) {
	vm, ok := bpf.Disassemble(naFilter)
	if !ok {
		t.Fatal("naFilter does not disassemble")
	}
	vmi, err := bpf.NewVM(vm)
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("fd00::100")
	nsFrame := frame(t, otherMAC, &ndp.NeighborSolicitation{TargetAddress: vip})
	arpFrame := frame(t, otherMAC, na(vip, otherMAC))
	binary.BigEndian.PutUint16(arpFrame[12:14], unix.ETH_P_ARP)
	for name, tt := range map[string]struct {
		frame []byte
		pass  bool
	}{
		"advertisement": {frame(t, otherMAC, na(vip, otherMAC)), true},
		"solicitation":  {nsFrame, false},
		"not IPv6":      {arpFrame, false},
	} {
		n, err := vmi.Run(tt.frame)
		if err != nil {
			t.Fatal(err)
		}
		if (n > 0) != tt.pass {
			t.Errorf("%s: filter returned %d, want pass=%v", name, n, tt.pass)
		}
	}
}

func TestARPClaim(t *testing.T) {
	vip := netip.MustParseAddr("10.0.0.100")
	pkt := func(op arp.Operation, mac net.HardwareAddr, ip netip.Addr) *arp.Packet {
		p, err := arp.NewPacket(op, mac, ip, ownMAC, netip.IPv4Unspecified())
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	eth := func(src net.HardwareAddr) *ethernet.Frame { return &ethernet.Frame{Source: src} }
	tests := []struct {
		name string
		p    *arp.Packet
		eth  *ethernet.Frame
		want net.HardwareAddr
	}{
		{"reply from another host", pkt(arp.OperationReply, otherMAC, vip), eth(otherMAC), otherMAC},
		{"gratuitous request from another host", pkt(arp.OperationRequest, otherMAC, vip), eth(otherMAC), otherMAC},
		{"our own announcement", pkt(arp.OperationReply, ownMAC, vip), eth(ownMAC), nil},
		{"our MAC in the frame only", pkt(arp.OperationReply, otherMAC, vip), eth(ownMAC), nil},
		{"another address", pkt(arp.OperationReply, otherMAC, netip.MustParseAddr("10.0.0.101")), eth(otherMAC), nil},
		{"our probe (sender 0.0.0.0)", pkt(arp.OperationRequest, ownMAC, netip.IPv4Unspecified()), eth(ownMAC), nil},
		{"nil", nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := arpClaim(tt.p, tt.eth, vip, ownMAC); got.String() != tt.want.String() {
				t.Fatalf("arpClaim = %q, want %q", got, tt.want)
			}
		})
	}
}
