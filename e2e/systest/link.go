package systest

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
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

// LoseCommitReplies lets the next skip COMMIT replies that cross the link
// pass, then drops PostgreSQL's reply to the n after them, closing each
// one's connection: the server committed and the replica never hears so,
// the one fault after which only the request's key can tell what
// happened. It returns the count of replies dropped so far.
func (l *Link) LoseCommitReplies(t *testing.T, skip, n int) (lost func() int) {
	t.Helper()
	w, err := l.p.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
		`{"name":"commit_lost","type":"commit_lost","stream":"downstream","attributes":{"skip":%d,"count":%d}}`, skip, n)))
	if err != nil {
		t.Fatalf("link fault commit_lost: %v", err)
	}
	c := w.Toxic.(*commitLost)
	return func() int { return int(c.lost.Load()) }
}

func init() { toxics.Register("commit_lost", new(commitLost)) }

// commitTag is the end of PostgreSQL's CommandComplete for COMMIT (a 'C'
// message, its length, "COMMIT" and its NUL), as the server sends it.
var commitTag = []byte("\x00\x00\x00\x0bCOMMIT\x00")

// commitLost is a toxiproxy toxic for a server's replies: past the first
// Skip COMMIT replies, the chunk holding each of the next Count is
// dropped and its connection closed. One instance serves every
// connection of the link.
type commitLost struct {
	Skip  int64 `json:"skip"`
	Count int64 `json:"count"`
	seen  atomic.Int64
	lost  atomic.Int64
}

func (c *commitLost) Pipe(stub *toxics.ToxicStub) {
	var tail []byte // a tag split across two chunks is found too
	for {
		select {
		case <-stub.Interrupt:
			return
		case chunk := <-stub.Input:
			if chunk == nil {
				stub.Close()
				return
			}
			buf := append(tail, chunk.Data...)
			if bytes.Contains(buf, commitTag) {
				if k := c.seen.Add(1); k > c.Skip && k <= c.Skip+c.Count {
					c.lost.Add(1)
					stub.Close() // the reply is dropped, the connection ends
					return
				}
			}
			tail = append([]byte(nil), buf[max(0, len(buf)-len(commitTag)+1):]...)
			stub.Output <- chunk
		}
	}
}
