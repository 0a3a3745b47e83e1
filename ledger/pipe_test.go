package ledger_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// turnProxy forwards TCP connections to PostgreSQL and counts round
// trips: the Sync and Query messages a client sends, each of which it then
// waits on (ReadyForQuery) before it can go on. Everything else a client
// sends (Parse, Bind, Execute ...) rides in the same write. pgx's
// liveness ping ("-- ping", sent when database/sql hands out a connection
// last reset over a second ago) is not counted: it is the pool's, not the
// batch's, and it came with every batch a loaded machine took over a
// second to build (a make test: 256 holds counted 3 round trips).
type turnProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	turns int
}

func startTurnProxy(t *testing.T, target string) *turnProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &turnProxy{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			wg.Go(func() {
				defer s.Close()
				p.frontend(io.TeeReader(c, s))
			})
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, s)
			})
		}
	})
	return p
}

// frontend reads a client's messages: the startup message (no type
// byte), then typed ones, counting Sync ('S') and Query ('Q').
func (p *turnProxy) frontend(r io.Reader) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:4]); err != nil {
		return
	}
	if _, err := io.CopyN(io.Discard, r, int64(binary.BigEndian.Uint32(hdr[:4]))-4); err != nil {
		return
	}
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		body := int64(binary.BigEndian.Uint32(hdr[1:])) - 4
		if hdr[0] == 'Q' && body == int64(len(ping)) {
			q := make([]byte, body)
			if _, err := io.ReadFull(r, q); err != nil {
				return
			}
			if string(q) != ping {
				p.turn()
			}
			continue
		}
		if hdr[0] == 'S' || hdr[0] == 'Q' {
			p.turn()
		}
		if _, err := io.CopyN(io.Discard, r, body); err != nil {
			return
		}
	}
}

// ping is pgconn.Ping's query, as a Query message carries it.
const ping = "-- ping\x00"

func (p *turnProxy) turn() {
	p.mu.Lock()
	p.turns++
	p.mu.Unlock()
}

func (p *turnProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.turns
}

// A batch of takes costs PostgreSQL the same round trips whatever its
// size and however many SKUs it spans (its statements go in one pipeline,
// then COMMIT), and so does a batch of confirms: one take alone costs as
// many as 256 over 100 SKUs.
func TestBatchRoundTripsConstant(t *testing.T) {
	ctx := context.Background()
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := startTurnProxy(t, u.Host)
	u.Host = p.ln.Addr().String()
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.Postgres, DSN: u.String(), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var skus []stock.SKU
	for i := range 100 {
		s := stock.SKU{Program: keys.MustID(fmt.Sprintf("p%d", i%10)), Ticket: keys.MustID(fmt.Sprintf("t%d", i))}
		skus = append(skus, s)
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 1000, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	batch := func(size int, hold bool) []ledger.Take {
		var takes []ledger.Take
		for i := range size {
			n++
			s := skus[(n*7)%len(skus)]
			buyer := fmt.Sprintf("b%d", i)
			key := fmt.Sprintf("k%d", n)
			if hold {
				takes = append(takes, ledger.HoldTake(ledger.Hold{IdempotencyKey: keys.MustID(key), SKU: s, Buyer: keys.MustID(buyer),
					Quantity: 1, ExpiresAt: time.Now().Add(time.Hour), Req: req(buyer, key, "hold", ledger.OpHold)}))
				continue
			}
			takes = append(takes, ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID(key), SKU: s, Buyer: keys.MustID(buyer),
				Quantity: 1, Req: req(buyer, key, "buy", ledger.OpPurchase)}))
		}
		return takes
	}
	trips := func(f func()) int {
		before := p.count()
		f()
		return p.count() - before
	}
	commit := func(takes []ledger.Take) []ledger.TakeResult {
		res := l.Commit(ctx, takes, false)
		for i, r := range res {
			if r.Err != nil {
				t.Fatalf("take %d: %v", i, r.Err)
			}
		}
		return res
	}
	commit(batch(3, false)) // pgx learns each statement's description once
	commit(batch(3, true))
	one := trips(func() { commit(batch(1, false)) })
	many := trips(func() { commit(batch(256, false)) })
	holds := trips(func() { commit(batch(256, true)) })
	if one != many || one != holds || one > 2 {
		t.Errorf("round trips: 1 take %d, 256 takes %d, 256 holds %d; want the same, at most 2", one, many, holds)
	}
	// Confirms: the holds are read once, then one pipeline and COMMIT.
	confirm := func(rs []ledger.TakeResult) {
		var cs []ledger.HoldRequest
		for i, r := range rs {
			h := r.Hold()
			cs = append(cs, ledger.HoldRequest{HoldID: h.ID, Buyer: h.Buyer, Req: req(h.Buyer.String(), fmt.Sprintf("c%d-%s", i, h.ID), "confirm", ledger.OpConfirm)})
		}
		res, err := l.ConfirmBatch(ctx, cs)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Err != nil {
				t.Fatalf("confirm %d: %v", i, r.Err)
			}
		}
	}
	confirm(commit(batch(2, true)))
	few := commit(batch(1, true))
	lots := commit(batch(200, true))
	oneC := trips(func() { confirm(few) })
	manyC := trips(func() { confirm(lots) })
	if oneC != manyC || oneC > 3 {
		t.Errorf("round trips: 1 confirm %d, 200 confirms %d; want the same, at most 3", oneC, manyC)
	}
	t.Logf("round trips per batch: takes %d, confirms %d", one, oneC)
}
