package systest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Link is a TCP fault proxy between a replica and a server (Shopify's
// toxiproxy, in the test's process): the link can be made slow or cut
// while the servers on both ends run on.
type Link struct {
	p    *toxiproxy.Proxy
	Addr string // where the replica connects
}

// NewLink proxies upstream (host:port) on a free loopback port until the
// test ends.
func NewLink(t *testing.T, upstream string) *Link {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "link", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("link to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Link{p: p, Addr: p.Listen}
}

// LedgerLink puts a Link between the PostgreSQL URL dsn and its server
// and returns the URL through it.
func LedgerLink(t *testing.T, dsn string) (*Link, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" || strings.Contains(u.Host, ",") {
		t.Fatalf("LedgerLink: %q is not a one-host PostgreSQL URL (%v)", dsn, err)
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "5432")
	}
	l := NewLink(t, host)
	u.Host = l.Addr
	return l, u.String()
}

// Latency adds d to every read in both directions (a round trip pays 2d).
func (l *Link) Latency(t *testing.T, d time.Duration) {
	t.Helper()
	for _, dir := range []string{"upstream", "downstream"} {
		l.add(t, fmt.Sprintf(`{"name":"latency_%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`, dir, dir, d.Milliseconds()))
	}
}

// Cut black-holes the link: bytes already in flight and any sent later are
// dropped, and no connection is closed, as when a network path dies
// silently. A connection used across the cut is broken for good; new
// ones work once the link heals.
func (l *Link) Cut(t *testing.T) {
	t.Helper()
	for _, dir := range []string{"upstream", "downstream"} {
		l.add(t, fmt.Sprintf(`{"name":"cut_%s","type":"timeout","stream":%q,"attributes":{"timeout":0}}`, dir, dir))
	}
}

// Heal removes every fault: new bytes flow again.
func (l *Link) Heal(t *testing.T) {
	t.Helper()
	l.p.Toxics.ResetToxics(t.Context())
}

func (l *Link) add(t *testing.T, spec string) {
	t.Helper()
	if _, err := l.p.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
		t.Fatalf("link fault %s: %v", spec, err)
	}
}
