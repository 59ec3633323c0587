package health

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"
)

// tokenTTL is how long a token read from disk is reused before the file is
// read again. Kubernetes rotates projected tokens well before they expire,
// so re-reading every few minutes is enough.
const tokenTTL = 5 * time.Minute

// tokenSource caches the bearer token file. An empty path means no token.
type tokenSource struct {
	path   string
	clock  Clock
	logger *slog.Logger

	mu      sync.Mutex
	token   string
	readAt  time.Time
	lastErr string // last read error other than "not found", logged once
}

// get returns the token to send, or "" for none. A cached token is reused
// for tokenTTL; without a cached token the file is read on every call.
func (s *tokenSource) get() string {
	if s.path == "" {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if s.token != "" && now.Sub(s.readAt) < tokenTTL {
		return s.token
	}
	data, err := os.ReadFile(s.path)
	tok := string(bytes.TrimSpace(data))
	if err != nil {
		tok = ""
	}
	switch {
	case tok != "" && s.token == "":
		s.logger.Info("health: bearer token loaded", "path", s.path)
	case tok == "" && s.token != "":
		s.logger.Warn("health: bearer token no longer available, probing without it", "path", s.path, "err", readErr(err))
	case tok != s.token:
		s.logger.Debug("health: bearer token changed", "path", s.path)
	}
	// A token file that exists but cannot be read is probably a
	// permission mistake: say so once rather than silently probing
	// anonymously.
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		if err.Error() != s.lastErr {
			s.logger.Warn("health: cannot read token file", "path", s.path, "err", err)
		}
		s.lastErr = err.Error()
	} else {
		s.lastErr = ""
	}
	s.token, s.readAt = tok, now
	return tok
}

func readErr(err error) string {
	if err == nil {
		return "file is empty"
	}
	return err.Error()
}
