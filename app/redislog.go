package app

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/stockgate/stockgate/internal/logevery"
)

// RedisLog is go-redis's logger (redis.SetLogger) writing into a slog
// logger: its own notices (a pool that cannot dial, a cluster whose nodes
// all fail a ping, slots moving) are otherwise plain-text lines on stderr,
// "redis: 2026/11/28 ... pool.go:770: ...", in the middle of the JSON log
// that collectors parse line by line. Each is a warning: go-redis logs only
// what went wrong or changed underneath, and the caller sees the errors.
// Which logger go-redis uses is process-wide, so main sets it, once.
//
// A node that is down is dialled by every pool that wants a connection,
// so one line per format a second goes through, with left_out counting
// the rest (logevery).
type RedisLog struct {
	Logger *slog.Logger
	lines  logevery.Limiter
}

// Printf logs one go-redis line, its "redis: " prefix and trailing
// newline dropped (the component attribute says whose it is).
func (l *RedisLog) Printf(ctx context.Context, format string, v ...any) {
	ok, left := l.lines.Allow(format, time.Now())
	if !ok {
		return
	}
	msg := strings.TrimSpace(strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
	l.Logger.WarnContext(ctx, msg, "component", "go-redis", "left_out", left)
}
