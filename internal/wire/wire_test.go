package wire

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func TestEgressGateways(t *testing.T) {
	for _, tc := range []struct {
		name string
		ips  []netip.Addr
	}{
		{"none", nil},
		{"v4 and v6", []netip.Addr{netip.MustParseAddr("10.0.0.200"), netip.MustParseAddr("fd00::200")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(EgressGatewaysHandler(func() []netip.Addr { return tc.ips }))
			defer srv.Close()
			got, err := GetEgressGateways(context.Background(), srv.Client(), strings.TrimPrefix(srv.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.ips) {
				t.Fatalf("got %v, want %v", got, tc.ips)
			}
			for _, ip := range tc.ips {
				if !got[ip] {
					t.Fatalf("got %v, want %v", got, tc.ips)
				}
			}
		})
	}
}

// TestEgressGatewaysErrors: a daemon without the endpoint (an older vipd)
// or a garbled answer is an error, not an empty set.
func TestEgressGatewaysErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
		want string
	}{
		{"not found", http.NotFound, "404"},
		{"garbled", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"egress_ips":["x"]}`)) }, "ParseAddr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.h)
			defer srv.Close()
			_, err := GetEgressGateways(context.Background(), srv.Client(), strings.TrimPrefix(srv.URL, "http://"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
}
