package bgp

import (
	"context"
	"log/slog"
	"sort"

	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
)

// slogBridge sends GoBGP's logs to slog. GoBGP is chatty at Info (every
// connection attempt, every notification); those go to Debug, while peer
// state changes are logged by the speaker itself at Info.
type slogBridge struct {
	l *slog.Logger
}

var _ gobgplog.Logger = slogBridge{}

func (b slogBridge) log(level slog.Level, msg string, fields gobgplog.Fields) {
	ctx := context.Background()
	if !b.l.Enabled(ctx, level) {
		return
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := make([]slog.Attr, 0, len(keys))
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, fields[k]))
	}
	b.l.LogAttrs(ctx, level, msg, attrs...)
}

func (b slogBridge) Panic(msg string, f gobgplog.Fields) { b.log(slog.LevelError, msg, f) }
func (b slogBridge) Fatal(msg string, f gobgplog.Fields) { b.log(slog.LevelError, msg, f) }
func (b slogBridge) Error(msg string, f gobgplog.Fields) { b.log(slog.LevelError, msg, f) }
func (b slogBridge) Warn(msg string, f gobgplog.Fields)  { b.log(slog.LevelWarn, msg, f) }
func (b slogBridge) Info(msg string, f gobgplog.Fields)  { b.log(slog.LevelDebug, msg, f) }
func (b slogBridge) Debug(msg string, f gobgplog.Fields) { b.log(slog.LevelDebug-4, msg, f) }

// SetLevel is ignored: the slog handler decides.
func (b slogBridge) SetLevel(gobgplog.LogLevel) {}

// GetLevel tells GoBGP whether to build its debug messages at all.
func (b slogBridge) GetLevel() gobgplog.LogLevel {
	if b.l.Enabled(context.Background(), slog.LevelDebug-4) {
		return gobgplog.DebugLevel
	}
	return gobgplog.InfoLevel
}
