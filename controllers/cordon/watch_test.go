package cordon

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/wire"
)

// TestAskHandover talks to a unix socket server that answers as the
// daemon's control socket does (cmd/vipd/control.go): the summary names
// each VIP's outcome, errors name the socket.
func TestAskHandover(t *testing.T) {
	for _, tc := range []struct {
		name, answer string
		code         int
		want         string
		wantErr      string
	}{
		{"handed over", `[{"vip":"10.0.0.100/32","to":"cp-2","ok":true,"reason":"ready"}]`, 200, "10.0.0.100/32 handed over to cp-2", ""},
		{"holds nothing", `[{"vip":"","ok":false,"reason":"this node holds no VIP","refused":true}]`, 200, "this node holds no VIP", ""},
		{"no successor", `[{"vip":"10.0.0.100/32","ok":false,"reason":"no eligible successor for 10.0.0.100/32"}]`, 200, "10.0.0.100/32: no eligible successor", ""},
		{"timeout", "handover still under way", 504, "", "handover: handover still under way"},
		{"garbage", "{", 200, "", "unreadable answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), wire.ControlSocket)
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			var body string
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				body = r.Method + " " + r.URL.Path + " " + string(b)
				w.WriteHeader(tc.code)
				_, _ = io.WriteString(w, tc.answer)
			})}
			go func() { _ = srv.Serve(ln) }()
			defer srv.Close()
			got, err := askHandover(context.Background(), sock)
			if body != "POST /handover {}" {
				t.Errorf("request %q, want POST /handover {}", body)
			}
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case !strings.Contains(got, tc.want):
				t.Fatalf("summary %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("no daemon", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), wire.ControlSocket)
		if _, err := askHandover(context.Background(), sock); err == nil || !strings.Contains(err.Error(), sock) {
			t.Fatalf("err %v, want one naming %s", err, sock)
		}
	})
}

func TestWatched(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"l2 with peers", map[string]string{"VIPD_PEERS": "10.0.0.2"}, true},
		{"l2 alone", map[string]string{}, false},
		{"bgp", map[string]string{"VIPD_MODE": "bgp", "VIPD_BGP_LOCAL_AS": "65001", "VIPD_BGP_PEERS": "10.0.0.1:65000", "VIPD_PEERS": "10.0.0.2"}, false},
		{"controllers only", map[string]string{"VIPD_ADDRESS": "", "VIPD_CONTROLLERS": "cordon", "VIPD_PEERS": "10.0.0.2"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{"VIPD_ADDRESS": "10.0.0.100/32", "VIPD_NODE_NAME": "cp-1", "VIPD_GOSSIP_INSECURE": "true"}
			for k, v := range tc.env {
				m[k] = v
			}
			c, err := config.Load(func(s *config.Setting) (string, bool) { v, ok := m[s.Env]; return v, ok })
			if err != nil {
				t.Fatal(err)
			}
			if got := Watched(c); got != tc.want {
				t.Fatalf("Watched = %v, want %v", got, tc.want)
			}
		})
	}
}
