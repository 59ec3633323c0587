package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// ControlSocket is the name of the daemon's control socket in
// VIPD_STATE_DIR: `vipd handover` and the cordon watch of vipd-controllers
// ask the daemon there.
const ControlSocket = "vipd.sock"

// HandoverPath is the control socket's endpoint for a planned handover
// (POST a HandoverRequest, the answer is a list of HandoverResult).
const HandoverPath = "/handover"

// HandoverRequest asks for a planned handover: the VIPs named (none: every
// VIP held) to To (empty: the best successor).
type HandoverRequest struct {
	VIPs []string `json:"vips,omitempty"`
	To   string   `json:"to,omitempty"`
}

// HandoverResult is the daemon's answer for one VIP: the JSON of
// cluster.HandoverResult (cmd/vipd checks that the two agree; the child
// does not link the cluster package).
type HandoverResult struct {
	VIP     string        `json:"vip"`
	To      string        `json:"to,omitempty"`
	OK      bool          `json:"ok"`
	Reason  string        `json:"reason"`
	At      time.Time     `json:"at"`
	Took    time.Duration `json:"took_ns,omitempty"`
	Preempt bool          `json:"preempt,omitempty"`
	Refused bool          `json:"refused,omitempty"`
}

// ErrNoDaemon wraps the error of a control socket nobody answers on.
var ErrNoDaemon = errors.New("cannot reach vipd's control socket")

// PostHandover sends req to the daemon's control socket sock, waiting up to
// timeout, and decodes the answer into out (a pointer to a slice of
// HandoverResult, or of the daemon's own type).
func PostHandover(ctx context.Context, sock string, req HandoverRequest, timeout time.Duration, out any) error {
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer client.CloseIdleConnections()
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://vipd"+HandoverPath, strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrNoDaemon, sock, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("handover: %s", strings.TrimSpace(string(b)))
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("handover: unreadable answer: %w", err)
	}
	return nil
}
