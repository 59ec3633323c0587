package cloud

import (
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"

	"golang.org/x/net/http/httpguts"
)

// tokenSource is an API token from a setting or a file, the one copy every
// backend uses: read at start-up (a missing or unusable token is a
// *SettingError naming the setting, never showing the token), read again
// from the file after a 401 so a rotated token is picked up, and added to
// every request by its RoundTripper.
type tokenSource struct {
	token, file string // as configured; token wins
	envName     string // "DIGITALOCEAN_ACCESS_TOKEN"
	fileName    string // "VIPD_DO_TOKEN_FILE"
	what        string // "a DigitalOcean API token"
	needs       string // what the token must allow, for the missing-token message
	log         *slog.Logger

	mu  sync.Mutex
	cur string
}

// load reads the token for the first time.
func (t *tokenSource) load() error {
	tok, err := t.read()
	if err != nil {
		return err
	}
	t.cur = tok
	return nil
}

func (t *tokenSource) read() (string, error) {
	if v := strings.TrimSpace(t.token); v != "" {
		if !httpguts.ValidHeaderFieldValue(v) {
			return "", &SettingError{Name: t.envName, Accepted: t.what + " (it has characters an HTTP header cannot carry)"}
		}
		return v, nil
	}
	if t.file == "" {
		return "", &SettingError{Name: t.envName, Accepted: t.what + " (" + t.needs + "), or " + t.fileName + " naming a file that holds one; cloud mode needs one of them"}
	}
	b, err := os.ReadFile(t.file)
	if err != nil {
		return "", &SettingError{Name: t.fileName, Value: t.file, Accepted: "a readable file holding " + t.what, Err: err}
	}
	v := strings.TrimSpace(string(b))
	if v == "" || strings.ContainsAny(v, " \t\n") || !httpguts.ValidHeaderFieldValue(v) {
		return "", &SettingError{Name: t.fileName, Value: t.file, Accepted: "a file holding exactly one token, " + t.what + " (it is empty, has spaces or control characters)"}
	}
	return v, nil
}

// reload re-reads the file after a 401 and reports whether the token
// changed (never when the token comes from the setting).
func (t *tokenSource) reload() bool {
	if t.file == "" || strings.TrimSpace(t.token) != "" {
		return false
	}
	v, err := t.read()
	if err != nil {
		t.log.Warn("cannot re-read the API token file", "file", t.file, "err", err)
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if v == t.cur {
		return false
	}
	t.cur = v
	t.log.Info("API token file changed; using the new token", "file", t.file)
	return true
}

func (t *tokenSource) get() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cur
}

// bearer adds the current token to every request.
type bearer struct {
	src  *tokenSource
	next http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.src.get())
	return b.next.RoundTrip(r)
}
