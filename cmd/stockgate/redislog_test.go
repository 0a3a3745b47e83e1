package main

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"
)

// go-redis wrote its own notices as plain text into the JSON log
// ("redis: 2026/11/28 ... pool.go:770: connection pool: failed to dial
// ..."), which log collectors that parse each line as JSON drop or choke
// on. With Redis unreachable (it dials at once, and fails), every line the
// gateway writes is a JSON object, go-redis's among them.
func TestRedisLogIsJSON(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close() // nothing listens there now: every dial is refused
	srv := startServe(t, "STOCKGATE_REDIS_ADDRS="+closed, "STOCKGATE_LOG_LEVEL=info")
	waitUntil(t, 20*time.Second, func() bool {
		return strings.Contains(srv.logs.String(), "failed to dial") // go-redis's, in whichever form
	})
	var redisLines int
	for _, line := range strings.Split(strings.TrimSpace(srv.logs.String()), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("a log line is not JSON: %q", line)
			continue
		}
		if entry["component"] == "go-redis" {
			redisLines++
			if entry["level"] != "WARN" || strings.HasPrefix(entry["msg"].(string), "redis: ") {
				t.Errorf("go-redis's line %q: want a warning without the redis: prefix", line)
			}
		}
	}
	if redisLines == 0 {
		t.Error("no go-redis line in the log")
	}
}
