package app

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A Redis node that is down is dialled by every pool that wants a
// connection: go-redis's identical notices go out a line a second, each
// saying how many it stands for; another notice is its own kind.
func TestRedisLogLineASecond(t *testing.T) {
	var out bytes.Buffer
	l := &RedisLog{Logger: slog.New(slog.NewJSONHandler(&out, nil))}
	from := time.Now()
	for i := range 1000 {
		l.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v", i, "refused")
	}
	l.Printf(context.Background(), "redis: cluster: slots moved")
	elapsed := time.Since(from)
	var dials, moved int
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("not JSON: %q", line)
		}
		switch {
		case strings.HasPrefix(e["msg"].(string), "connection pool: failed to dial"):
			dials++
		case e["msg"] == "cluster: slots moved":
			moved++
		}
	}
	if most := 1 + int(elapsed/time.Second); dials < 1 || dials > most {
		t.Errorf("1,000 dial failures in %v logged %d lines, want 1 to %d", elapsed, dials, most)
	}
	if moved != 1 {
		t.Errorf("the other notice logged %d lines, want 1", moved)
	}
}
