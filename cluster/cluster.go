// Package cluster builds the Redis Cluster client stockgate runs on, with
// settings chosen for failover rather than go-redis's general defaults.
//
// What happens when a master dies, and what each setting does about it:
//
//   - Until the cluster promotes a replica (cluster-node-timeout plus an
//     election, about 2-3 s with a 2 s node timeout), calls for the dead
//     master's slots fail. DialTimeout 1s and DialerRetries 1 make each
//     failure cost about a second rather than go-redis's 5 s dial timeout times
//     5 dial retries; the breaker then opens and purchases go to the ledger.
//   - ReadTimeout and WriteTimeout 500ms: a stock script runs in microseconds,
//     so a reply that takes half a second means a sick node, not a slow query.
//     ContextTimeoutEnabled lets every call's context deadline cut it shorter.
//   - StateReloadEvery 1s: go-redis reloads its slot map lazily, when a call
//     finds the map older than this (and at once on MOVED). Its default is
//     60 s; at 1 s a promoted replica is used within about a second of its
//     election, without a background loop of our own.
//   - Reads go to masters only (ReadOnly false): a replica may be behind, and
//     stock must never be read stale.
//   - Re-sends are safe: every stockgate script is idempotent per request id,
//     so go-redis's own retry of a command whose reply was lost cannot move
//     stock twice.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options configures New; zero values take the defaults in the package doc.
type Options struct {
	Addrs            []string // seed nodes, host:port; required
	Password         string
	DialTimeout      time.Duration // default 1s
	ReadTimeout      time.Duration // default 500ms
	WriteTimeout     time.Duration // default 500ms
	PoolSize         int           // connections per node; default 64
	StateReloadEvery time.Duration // default 1s
	// Dialer replaces the TCP dialer (tests inject faults with it).
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
}

// New validates opts and returns a client. It does not connect yet.
func New(opts Options) (*redis.ClusterClient, error) {
	if len(opts.Addrs) == 0 {
		return nil, errors.New("cluster: Options.Addrs is required")
	}
	for _, a := range opts.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("cluster: address %q: %w", a, err)
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&opts.DialTimeout, time.Second)
	def(&opts.ReadTimeout, 500*time.Millisecond)
	def(&opts.WriteTimeout, 500*time.Millisecond)
	def(&opts.StateReloadEvery, time.Second)
	if opts.PoolSize == 0 {
		opts.PoolSize = 64
	}
	if opts.DialTimeout < 0 || opts.ReadTimeout < 0 || opts.WriteTimeout < 0 || opts.StateReloadEvery < 0 || opts.PoolSize < 0 {
		return nil, errors.New("cluster: negative setting")
	}
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                      opts.Addrs,
		Password:                   opts.Password,
		Dialer:                     opts.Dialer,
		DialTimeout:                opts.DialTimeout,
		DialerRetries:              1,
		ReadTimeout:                opts.ReadTimeout,
		WriteTimeout:               opts.WriteTimeout,
		ContextTimeoutEnabled:      true,
		PoolSize:                   opts.PoolSize,
		PoolTimeout:                opts.ReadTimeout + opts.DialTimeout,
		ClusterStateReloadInterval: opts.StateReloadEvery,
		ReadOnly:                   false,
	}), nil
}
