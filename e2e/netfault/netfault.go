// Package netfault is a TCP fault proxy between a stockgate process and
// a server it talks to (Shopify's toxiproxy, in the caller's process):
// the link can be made slow, cut, or made to lose PostgreSQL's reply to a
// COMMIT while the servers on both ends run on. The e2e tests (through
// systest) and stockbench's faults run share it.
package netfault

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// Link proxies one upstream address on a free loopback port.
type Link struct {
	p    *toxiproxy.Proxy
	Addr string // where the client connects
}

// New proxies upstream (host:port) until Stop.
func New(upstream string) (*Link, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "link", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("netfault: link to %s: %w", upstream, err)
	}
	return &Link{p: p, Addr: p.Listen}, nil
}

// Postgres puts a Link between the one-host PostgreSQL URL dsn and its
// server and returns the URL through it.
func Postgres(dsn string) (*Link, string, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" || strings.Contains(u.Host, ",") {
		return nil, "", fmt.Errorf("netfault: %q is not a one-host PostgreSQL URL (%v)", dsn, err)
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "5432")
	}
	l, err := New(host)
	if err != nil {
		return nil, "", err
	}
	u.Host = l.Addr
	return l, u.String(), nil
}

// Stop closes the proxy and every connection through it.
func (l *Link) Stop() { l.p.Stop() }

// Latency adds d to every read in both directions (a round trip pays 2d).
func (l *Link) Latency(d time.Duration) error {
	for _, dir := range []string{"upstream", "downstream"} {
		if err := l.add(fmt.Sprintf(`{"name":"latency_%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`,
			dir, dir, d.Milliseconds())); err != nil {
			return err
		}
	}
	return nil
}

// Cut black-holes the link: bytes already in flight and any sent later are
// dropped, and no connection is closed, as when a network path dies
// silently. A connection used across the cut is broken for good; new
// ones work once the link heals.
func (l *Link) Cut() error {
	for _, dir := range []string{"upstream", "downstream"} {
		if err := l.add(fmt.Sprintf(`{"name":"cut_%s","type":"timeout","stream":%q,"attributes":{"timeout":0}}`, dir, dir)); err != nil {
			return err
		}
	}
	return nil
}

// Bandwidth limits the link to rate KB a second each way.
func (l *Link) Bandwidth(rate int) error {
	for _, dir := range []string{"upstream", "downstream"} {
		if err := l.add(fmt.Sprintf(`{"name":"bandwidth_%s","type":"bandwidth","stream":%q,"attributes":{"rate":%d}}`,
			dir, dir, rate)); err != nil {
			return err
		}
	}
	return nil
}

// Reset resets (TCP RST) every connection that carries a byte either way
// until Heal: those in use when it is called, and those the client opens
// again meanwhile.
func (l *Link) Reset() error {
	for _, dir := range []string{"upstream", "downstream"} {
		if err := l.add(fmt.Sprintf(`{"name":"reset_%s","type":"reset_peer","stream":%q,"attributes":{"timeout":0}}`, dir, dir)); err != nil {
			return err
		}
	}
	return nil
}

// Heal removes every fault: new bytes flow again.
func (l *Link) Heal(ctx context.Context) { l.p.Toxics.ResetToxics(ctx) }

// LoseCommitReplies lets the next skip COMMIT replies that cross the link
// pass, then drops PostgreSQL's reply to the n after them, closing each
// one's connection: the server committed and the client never hears so,
// the one fault after which only the request's key can tell what
// happened. lost counts the replies dropped so far.
func (l *Link) LoseCommitReplies(skip, n int) (lost func() int, err error) {
	w, err := l.p.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
		`{"name":"commit_lost","type":"commit_lost","stream":"downstream","attributes":{"skip":%d,"count":%d}}`, skip, n)))
	if err != nil {
		return nil, fmt.Errorf("netfault: commit_lost: %w", err)
	}
	c := w.Toxic.(*commitLost)
	return func() int { return int(c.lost.Load()) }, nil
}

// LoseEveryCommitReply drops PostgreSQL's reply to one COMMIT in every
// (and closes its connection) until Heal: a link that keeps losing them.
// lost counts the replies dropped so far.
func (l *Link) LoseEveryCommitReply(every int) (lost func() int, err error) {
	w, err := l.p.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
		`{"name":"commit_lost","type":"commit_lost","stream":"downstream","attributes":{"every":%d}}`, every)))
	if err != nil {
		return nil, fmt.Errorf("netfault: commit_lost: %w", err)
	}
	c := w.Toxic.(*commitLost)
	return func() int { return int(c.lost.Load()) }, nil
}

func (l *Link) add(spec string) error {
	if _, err := l.p.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
		return fmt.Errorf("netfault: %s: %w", spec, err)
	}
	return nil
}

func init() { toxics.Register("commit_lost", new(commitLost)) }

// commitTag is the end of PostgreSQL's CommandComplete for COMMIT (a 'C'
// message, its length, "COMMIT" and its NUL), as the server sends it.
var commitTag = []byte("\x00\x00\x00\x0bCOMMIT\x00")

// commitLost is a toxiproxy toxic for a server's replies: past the first
// Skip COMMIT replies, the chunk holding each of the next Count (or, with
// Every, one in Every for as long as the toxic stands) is dropped and its
// connection closed. One instance serves every connection of the link.
type commitLost struct {
	Skip  int64 `json:"skip"`
	Count int64 `json:"count"`
	Every int64 `json:"every"`
	seen  atomic.Int64
	lost  atomic.Int64
}

// drops says whether the k-th COMMIT reply seen is dropped.
func (c *commitLost) drops(k int64) bool {
	if c.Every > 0 {
		return k%c.Every == 0
	}
	return k > c.Skip && k <= c.Skip+c.Count
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
			if bytes.Contains(buf, commitTag) && c.drops(c.seen.Add(1)) {
				c.lost.Add(1)
				stub.Close() // the reply is dropped, the connection ends
				return
			}
			tail = append([]byte(nil), buf[max(0, len(buf)-len(commitTag)+1):]...)
			stub.Output <- chunk
		}
	}
}
