package sale

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/internal/testenv/ledgerenv"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/shard"
)

// testService is a Service for tests: its gate and locks on rdb (a Redis
// Cluster client, or the in-memory shardmem), its seats on st (nil: no
// reserved seating), its ledger a SQLite file; stopped at the test's end.
// tune changes its options before it starts.
func testService(t testing.TB, rdb lock.Redis, st *seats.Store, tune ...func(*Options)) (*Service, *shard.Store) {
	t.Helper()
	return testServiceAt(t, rdb, st, nil, tune...)
}

// testServiceAt is testService with its ledger's clock now (nil: the
// machine's): a test moves the ledger's time where it is under test (a
// resale settle counts only sales older than ledger.ResaleHorizon).
func testServiceAt(t testing.TB, rdb lock.Redis, st *seats.Store, now func() time.Time, tune ...func(*Options)) (*Service, *shard.Store) {
	t.Helper()
	c, err := cache.New(cache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := shard.New(shard.Options{Redis: rdb, Empty: c})
	if err != nil {
		t.Fatal(err)
	}
	locker, err := lock.New(lock.Options{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	led, err := fleet.Open(context.Background(), fleet.Options{Primaries: []fleet.Primary{{Name: "main",
		Ledger: ledger.Options{Driver: ledger.SQLite, DSN: ledgerenv.SQLitePath(t), Now: now}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	o := Options{Gate: gate, Ledger: led, Cache: c, Locker: locker, Seats: st,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry()}
	for _, f := range tune {
		f(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, gate
}
