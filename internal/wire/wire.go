// Package wire holds what vipd and its vipd-controllers children say to
// each other, in one place for both binaries: the lines of the egress
// policy feed and of the pools feed (child to daemon, NDJSON on the
// child's stdout, supervised by internal/child: EgressDoc, PoolSnapshot)
// and the daemon's answer to "which egress IPs is this node the gateway
// of" (daemon to child, GET EgressGatewaysPath on VIPD_METRICS_ADDRESS).
package wire

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
)

// EgressRule is one rule of the egress policy feed.
type EgressRule struct {
	Policy   string   `json:"policy"` // namespace/name
	EgressIP string   `json:"egressIP"`
	From     []string `json:"from"`
	To       []string `json:"to"`
}

// EgressAddress is an egress IP that is not among the nodes' elected
// addresses (VIPD_ADDRESS, VIPD_EGRESS): vipd holds it at run time through
// its pools machine, on one of Nodes (the nodes matching the policy's
// spec.nodeSelector; every node without one).
type EgressAddress struct {
	Policy   string   `json:"policy"`
	EgressIP string   `json:"egressIP"`
	Nodes    []string `json:"nodes"`
}

// EgressDoc is one line of the egress policy feed: the complete rule set
// and the runtime egress addresses.
type EgressDoc struct {
	Rules     []EgressRule    `json:"rules"`
	Addresses []EgressAddress `json:"addresses,omitempty"`
}

// EgressGatewaysPath is the daemon's endpoint, on VIPD_METRICS_ADDRESS,
// that answers EgressGateways.
const EgressGatewaysPath = "/egress/gateways"

// EgressGateways are the egress IPs this node is the gateway of: elected
// egress IPs in the gateway role and runtime egress addresses it holds.
type EgressGateways struct {
	IPs []netip.Addr `json:"egress_ips"`
}

// EgressGatewaysHandler serves EgressGatewaysPath from gateways (the
// daemon's side).
func EgressGatewaysHandler(gateways func() []netip.Addr) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		ips := gateways()
		if ips == nil {
			ips = []netip.Addr{}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(EgressGateways{IPs: ips})
	})
}

// GetEgressGateways asks the daemon at addr (host:port) for the egress
// IPs this node is the gateway of (the child's side).
func GetEgressGateways(ctx context.Context, client *http.Client, addr string) (map[netip.Addr]bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+EgressGatewaysPath, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("vipd %s: %w", EgressGatewaysPath, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("vipd %s: %s", EgressGatewaysPath, resp.Status)
	}
	var g EgressGateways
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&g); err != nil {
		return nil, fmt.Errorf("vipd %s: %w", EgressGatewaysPath, err)
	}
	out := make(map[netip.Addr]bool, len(g.IPs))
	for _, ip := range g.IPs {
		if ip.IsValid() {
			out[ip] = true
		}
	}
	return out, nil
}
