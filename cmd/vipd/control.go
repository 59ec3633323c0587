package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/internal/wire"
)

// ControlSocket is the name of the daemon's control socket in
// VIPD_STATE_DIR: a unix socket only root can open (mode 0600), so only
// local administrators can move VIPs; nothing listens on the network for it.
// Its requests and answers are in internal/wire.
const ControlSocket = wire.ControlSocket

// forgetRequest is the body of POST /forget on the control socket.
type forgetRequest struct {
	Name string `json:"name"`
}

// forgetter is an election that removes a member on request (the lease
// election: a configuration change through the leader).
type forgetter interface{ Forget(name string) error }

// postForget asks the running daemon to forget a member. It returns
// errNoDaemon when nothing listens on the socket.
func postForget(ctx context.Context, sock, name string) error {
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}},
	}
	body, _ := json.Marshal(forgetRequest{Name: name})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://vipd/forget", strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return errNoDaemon
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	}
	return fmt.Errorf("forget %s: %s", name, strings.TrimSpace(string(b)))
}

var errNoDaemon = errors.New("vipd is not running on this node")

// controlServer serves the control socket.
type controlServer struct {
	*httpServer
	path string
}

// startControlServer listens on the control socket in dir.
func startControlServer(dir string, d *daemon, log *slog.Logger) (*controlServer, error) {
	path := filepath.Join(dir, ControlSocket)
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("VIPD_STATE_DIR: %s exists and is not a socket", path)
		}
		_ = os.Remove(path) // left by a crash
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+wire.HandoverPath, func(w http.ResponseWriter, r *http.Request) {
		var req wire.HandoverRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
			http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), cluster.HandoverWait())
		defer cancel()
		log.Info("handover requested", "vips", req.VIPs, "to", req.To)
		rs, err := d.elector.HandOver(ctx, req.VIPs, req.To, false)
		if err != nil {
			http.Error(w, err.Error(), http.StatusGatewayTimeout)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rs)
	})
	mux.HandleFunc("POST /forget", func(w http.ResponseWriter, r *http.Request) {
		var req forgetRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil || req.Name == "" {
			http.Error(w, "bad request: want {\"name\": NODE}", http.StatusBadRequest)
			return
		}
		f, ok := d.elector.(forgetter)
		if !ok {
			http.Error(w, "this vipd runs no election (no VIPD_PEERS, or bgp mode): nothing to forget", http.StatusNotImplemented)
			return
		}
		log.Info("forget requested", "member", req.Name)
		if err := f.Forget(req.Name); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	return &controlServer{serveHTTP(ln, mux), path}, nil
}

// Close stops serving and removes the socket.
func (c *controlServer) Close() {
	c.httpServer.Close()
	_ = os.Remove(c.path)
}

// normalizeVIP accepts a VIP as an address or in CIDR form.
func normalizeVIP(s string) (string, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.String(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return "", fmt.Errorf("%q is not a VIP (an address such as 10.0.0.100 or 10.0.0.100/32)", s)
	}
	return netip.PrefixFrom(a, a.BitLen()).String(), nil
}

func newHandoverCmd() *cobra.Command {
	var dir, to string
	cmd := &cobra.Command{
		Use:   "handover [--to NODE] [VIP...]",
		Short: "move the VIPs this node holds to another node now (planned handover)",
		Long: `handover asks the vipd running on this node to hand the VIPs it holds (all of
them, or the VIPs named) to another node, for example before maintenance. The
successor gets ready first, then this node releases the VIP and the successor
binds it and announces it within milliseconds: clients typically see an
outage of tens of milliseconds, and at no moment do two nodes answer for
the VIP.

Without --to the best eligible node takes each VIP (highest VIPD_PRIORITY,
then the usual ranking). The command refuses, and nothing moves, when no
other node is alive, healthy, has quorum and can hold the VIP, or when --to
names a node that is unknown, suspect, unhealthy or cannot hold it. If the
successor does not answer within 0.5 s the VIP stays where it is.

It talks to the daemon over its control socket, VIPD_STATE_DIR/vipd.sock
(only root can open it); there is no network control interface. The result
is also shown by "vipd status".

Note that the VIP may come back: a node with a higher VIPD_PRIORITY takes it
again after VIPD_PREEMPT_DELAY when that is set.

Exit status: 0 when every VIP was handed over, 1 otherwise (the message
says why for each VIP), 2 for a bad argument.`,
		Example: `  vipd handover                      # every VIP this node holds, to the best node
  vipd handover --to cp-2            # to cp-2
  vipd handover 10.0.0.100           # one VIP`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				dir = os.Getenv("VIPD_STATE_DIR")
			}
			if dir == "" {
				dir = "/var/lib/vipd"
			}
			req := wire.HandoverRequest{To: to}
			for _, a := range args {
				v, err := normalizeVIP(a)
				if err != nil {
					return usageError{err}
				}
				req.VIPs = append(req.VIPs, v)
			}
			rs, err := postHandover(cmd.Context(), filepath.Join(dir, ControlSocket), req)
			if err != nil {
				return err
			}
			text, ok := handoverSummary(rs)
			if !ok {
				return errors.New(strings.TrimSuffix(strings.ReplaceAll(text, "\n", "; "), "; "))
			}
			_, err = io.WriteString(cmd.OutOrStdout(), text)
			return err
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "the node to hand the VIPs to (VIPD_NODE_NAME of a cluster member); default: the best eligible node")
	cmd.Flags().StringVar(&dir, "state-dir", "", "the daemon's state directory, where its control socket is [env VIPD_STATE_DIR, default /var/lib/vipd]")
	return cmd
}

func postHandover(ctx context.Context, sock string, req wire.HandoverRequest) ([]cluster.HandoverResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	var rs []cluster.HandoverResult
	err := wire.PostHandover(ctx, sock, req, cluster.HandoverWait()+2*time.Second, &rs)
	if errors.Is(err, wire.ErrNoDaemon) {
		return nil, fmt.Errorf("is vipd running in a cluster (l2 or cloud mode with VIPD_PEERS)? %w", err)
	}
	return rs, err
}
