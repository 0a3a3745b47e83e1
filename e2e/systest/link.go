package systest

import (
	"testing"
	"time"

	"github.com/stockgate/stockgate/e2e/netfault"
)

// Link is a TCP fault proxy between a replica and a server (a
// netfault.Link that ends with the test): the link can be made slow or
// cut while the servers on both ends run on.
type Link struct {
	l    *netfault.Link
	Addr string // where the replica connects
}

// NewLink proxies upstream (host:port) on a free loopback port until the
// test ends.
func NewLink(t *testing.T, upstream string) *Link {
	t.Helper()
	l, err := netfault.New(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	return &Link{l: l, Addr: l.Addr}
}

// LedgerLink puts a Link between the PostgreSQL URL dsn and its server
// and returns the URL through it.
func LedgerLink(t *testing.T, dsn string) (*Link, string) {
	t.Helper()
	l, through, err := netfault.Postgres(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	return &Link{l: l, Addr: l.Addr}, through
}

// Latency adds d to every read in both directions (a round trip pays 2d).
func (l *Link) Latency(t *testing.T, d time.Duration) {
	t.Helper()
	if err := l.l.Latency(d); err != nil {
		t.Fatal(err)
	}
}

// Cut black-holes the link (netfault.Link.Cut).
func (l *Link) Cut(t *testing.T) {
	t.Helper()
	if err := l.l.Cut(); err != nil {
		t.Fatal(err)
	}
}

// Bandwidth limits the link to rate KB a second each way.
func (l *Link) Bandwidth(t *testing.T, rate int) {
	t.Helper()
	if err := l.l.Bandwidth(rate); err != nil {
		t.Fatal(err)
	}
}

// Reset resets every connection that carries a byte until Heal
// (netfault.Link.Reset).
func (l *Link) Reset(t *testing.T) {
	t.Helper()
	if err := l.l.Reset(); err != nil {
		t.Fatal(err)
	}
}

// Heal removes every fault: new bytes flow again.
func (l *Link) Heal(t *testing.T) {
	t.Helper()
	l.l.Heal(t.Context())
}

// LoseCommitReplies lets the next skip COMMIT replies that cross the link
// pass, then drops PostgreSQL's reply to the n after them
// (netfault.Link.LoseCommitReplies). It returns the count of replies
// dropped so far.
func (l *Link) LoseCommitReplies(t *testing.T, skip, n int) (lost func() int) {
	t.Helper()
	lost, err := l.l.LoseCommitReplies(skip, n)
	if err != nil {
		t.Fatal(err)
	}
	return lost
}
