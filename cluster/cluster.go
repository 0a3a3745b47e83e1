// Package cluster builds the Redis Cluster client stockgate runs on, with
// settings chosen for failover rather than go-redis's general defaults.
//
// What happens when a master dies, and what each setting does about it:
//
//   - Until the cluster promotes a replica (cluster-node-timeout plus an
//     election, about 2-3 s with a 2 s node timeout), calls for the dead
//     master's slots fail. DialTimeout 1s and DialerRetries 1 make each
//     failure cost about a second rather than go-redis's 5 s dial timeout times
//     5 dial retries (a killed master refuses at once); that master's
//     breaker (see Guard) then opens, and only its SKUs go to the ledger.
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
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"

	"github.com/stockgate/stockgate/internal/opt"
	"github.com/stockgate/stockgate/tracing"
)

// Options configures New; zero values take the defaults in the package doc.
type Options struct {
	Addrs []string // seed nodes, host:port; required
	// Username and Password log in with Redis 6+ ACLs (AUTH username
	// password); Password alone is the old requirepass.
	Username string
	Password string
	// TLS, when Enabled, speaks TLS to every node: what managed Redis
	// services with encryption in transit require.
	TLS              TLS
	DialTimeout      time.Duration // default 1s
	ReadTimeout      time.Duration // default 500ms
	WriteTimeout     time.Duration // default 500ms
	PoolSize         int           // connections per node; default 64
	StateReloadEvery time.Duration // default 1s
	// Dialer replaces the TCP dialer (tests inject faults with it).
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
}

// TLS configures encryption to the nodes.
type TLS struct {
	Enabled bool
	// CAFile is a PEM bundle of the CAs that sign the nodes' certificates;
	// empty trusts the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate, for servers that
	// ask for one (tls-auth-clients yes). Both or neither.
	CertFile, KeyFile string
	// ServerName is the name the nodes' certificates are checked against;
	// empty uses each node's host. Cluster nodes announce IP addresses, so a
	// managed service's certificate usually needs its name here.
	ServerName string
	// InsecureSkipVerify accepts any certificate: for a lab only.
	InsecureSkipVerify bool
}

// config builds the tls.Config, reading the files.
func (t TLS) config() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS CA: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS CA: no certificate in %s", t.CAFile)
		}
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("TLS client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// DefaultOptions are the settings a zero field takes.
func DefaultOptions() Options {
	return Options{DialTimeout: time.Second, ReadTimeout: 500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond, PoolSize: 64, StateReloadEvery: time.Second}
}

// Validate reports the first field that cannot work (an *opt.Error).
func (o Options) Validate() error {
	if len(o.Addrs) == 0 {
		return opt.Bad("Addrs", "is required")
	}
	for _, a := range o.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return opt.Bad("Addrs", fmt.Sprintf("%q is not host:port", a))
		}
	}
	for name, d := range map[string]time.Duration{"DialTimeout": o.DialTimeout, "ReadTimeout": o.ReadTimeout,
		"WriteTimeout": o.WriteTimeout, "StateReloadEvery": o.StateReloadEvery} {
		if d < 0 {
			return opt.Bad(name, "must not be negative")
		}
	}
	if o.PoolSize < 0 {
		return opt.Bad("PoolSize", "must be at least 1")
	}
	if (o.TLS.CertFile == "") != (o.TLS.KeyFile == "") {
		return opt.Bad("TLS.KeyFile", "give both a client certificate and its key, or neither")
	}
	if !o.TLS.Enabled && (o.TLS.CAFile != "" || o.TLS.CertFile != "" || o.TLS.ServerName != "") {
		return opt.Bad("TLS.Enabled", "TLS files or a server name are set but TLS is not enabled")
	}
	return nil
}

// New validates opts and returns a client. It does not connect yet.
func New(opts Options) (*redis.ClusterClient, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	d := DefaultOptions()
	opt.Fill(&opts.DialTimeout, d.DialTimeout)
	opt.Fill(&opts.ReadTimeout, d.ReadTimeout)
	opt.Fill(&opts.WriteTimeout, d.WriteTimeout)
	opt.Fill(&opts.StateReloadEvery, d.StateReloadEvery)
	opt.Fill(&opts.PoolSize, d.PoolSize)
	tlsConf, err := opts.TLS.config()
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                      opts.Addrs,
		Username:                   opts.Username,
		Password:                   opts.Password,
		TLSConfig:                  tlsConf,
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
	})
	if tracing.Enabled() {
		// A span per command and pipeline (redisotel, go-redis's own),
		// the child of the span of the request, gate call or sweep that
		// sends it, through the provider otelenv.Setup made global: the
		// waiting room's, the relay's and the sweepers' Redis work is in
		// their traces too. Commands' arguments stay out of the spans
		// (buyers' ids, tokens). Off, no hook is installed at all.
		tp := tracing.ChildrenOnly(otel.GetTracerProvider()) // none for the background loops' commands
		if err := redisotel.InstrumentTracing(c, redisotel.WithDBStatement(false), redisotel.WithTracerProvider(tp)); err != nil {
			_ = c.Close() // not connected yet: nothing to lose
			return nil, fmt.Errorf("cluster: tracing: %w", err)
		}
	}
	return c, nil
}
