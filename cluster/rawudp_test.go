package cluster

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSockaddrRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		to   string
		v6   bool
		want string // "" : an error
	}{
		{"v4 on v4", "10.1.2.3:7946", false, "10.1.2.3:7946"},
		{"mapped v4 on v4", "[::ffff:10.1.2.3]:7946", false, "10.1.2.3:7946"},
		{"v4 on v6 comes back unmapped", "10.1.2.3:7946", true, "10.1.2.3:7946"},
		{"v6 on v6", "[fd00::1]:65535", true, "[fd00::1]:65535"},
		{"v6 on v4", "[fd00::1]:7946", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sa unix.RawSockaddrAny
			_, err := encodeSockaddr(&sa, netip.MustParseAddrPort(tc.to), tc.v6)
			if tc.want == "" {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeSockaddr(&sa)
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want {
				t.Errorf("got %v, want %s", got, tc.want)
			}
		})
	}
}

// TestRawUDPExchange sends through the raw calls between a v4 and a
// dual-stack socket and checks payload and sender.
func TestRawUDPExchange(t *testing.T) {
	for _, network := range []string{"udp4", "udp"} {
		t.Run(network, func(t *testing.T) {
			a, err := net.ListenUDP(network, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ra, err := newRawUDP(a)
			if err != nil {
				t.Fatal(err)
			}
			rb, err := newRawUDP(b)
			if err != nil {
				t.Fatal(err)
			}
			aAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(a.LocalAddr().(*net.UDPAddr).Port))
			bAddr := b.LocalAddr().(*net.UDPAddr).AddrPort()
			if err := rb.writeTo([]byte("ping"), aAddr); err != nil {
				t.Fatal(err)
			}
			a.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 64)
			n, from, err := ra.readFrom(buf)
			if err != nil {
				t.Fatal(err)
			}
			if string(buf[:n]) != "ping" || from != bAddr {
				t.Errorf("read %q from %v, want ping from %v", buf[:n], from, bAddr)
			}
			if err := ra.writeTo([]byte("pong"), bAddr); err != nil {
				t.Fatal(err)
			}
			b.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, from, err = rb.readFrom(buf)
			if err != nil {
				t.Fatal(err)
			}
			if string(buf[:n]) != "pong" || from != aAddr {
				t.Errorf("read %q from %v, want pong from %v", buf[:n], from, aAddr)
			}
		})
	}
}
