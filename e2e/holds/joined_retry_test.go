package holds_test

// Found by TestModelConcurrent (e2e/model/concurrent_test.go): a retry
// answered 201 without Idempotent-Replayed.

import (
	"bytes"
	"context"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// One confirm sent to two replicas at once under one key: B makes the
// order, A answers its replay as soon as B has committed, while B is still
// finishing (its Redis restore of the units not kept). A platform then
// retries the request it was answered on B: the retry joins B's copy
// still in flight and gets its answer. That answer is the replay of a
// request made: 201 with the order and Idempotent-Replayed: true, as on
// A; without the header, the platform reads a second request made.
// The key stays bound to its request: another body under it is 422.
func TestRetryJoiningItsCopyInFlightIsReplayed(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		held := &heldConfirm{key: keys.MustID("pay-1"), committed: make(chan struct{}), release: make(chan struct{})}
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: func(o *app.Options) {
			o.WrapLedger = func(l sale.Ledger) sale.Ledger { held.Ledger = l; return held }
		}})
		t.Cleanup(held.free) // before B's server closes, which waits for its requests
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 1, 4)
		_, h := a.Hold(t, sku, "h1", "ann", 4, 300)
		if h.HoldID == "" {
			t.Fatal("hold not made")
		}
		send := func(e *systest.Env, key string, q int64) (systest.Reply, int64) {
			return confirmPart(t, e, h.HoldID, key, "ann", q)
		}

		var wg sync.WaitGroup
		var made, joined systest.Reply
		wg.Go(func() { made, _ = send(b, "pay-1", 3) })
		select {
		case <-held.committed:
		case <-time.After(30 * time.Second):
			t.Fatal("B's confirm did not commit")
		}
		order := func() string {
			cur, err := a.Ledger.HoldByID(context.Background(), keys.MustID(h.HoldID))
			if err != nil || cur.State != ledger.Confirmed {
				t.Fatalf("hold after B's commit: %+v, %v", cur, err)
			}
			return cur.OrderID.String()
		}()
		if r, q := send(a, "pay-1", 3); r.Status != http.StatusCreated || systest.OrderID(r) != order || q != 3 ||
			r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the copy on A = %d %s (replayed %q), want 201 with order %s of 3, replayed",
				r.Status, r.Body, r.Header.Get("Idempotent-Replayed"), order)
		}
		wg.Go(func() { joined, _ = send(b, "pay-1", 3) })
		systest.WaitFor(t, 30*time.Second, "the retry to join its copy in flight on B", func() bool { return confirmsJoined() > 0 })
		held.free()
		wg.Wait()

		if made.Status != http.StatusCreated || systest.OrderID(made) != order || made.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("the copy on B = %d %s (replayed %q), want 201 with order %s, made",
				made.Status, made.Body, made.Header.Get("Idempotent-Replayed"), order)
		}
		if joined.Status != http.StatusCreated || systest.OrderID(joined) != order || joined.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the retry on B = %d %s (replayed %q), want 201 with order %s, replayed",
				joined.Status, joined.Body, joined.Header.Get("Idempotent-Replayed"), order)
		}
		for _, e := range []*systest.Env{a, b} {
			if r, _ := send(e, "pay-1", 3); r.Status != http.StatusCreated || systest.OrderID(r) != order ||
				r.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("a later retry = %d %s (replayed %q), want 201 with order %s, replayed",
					r.Status, r.Body, r.Header.Get("Idempotent-Replayed"), order)
			}
			if r, _ := send(e, "pay-1", 2); r.Status != http.StatusUnprocessableEntity || systest.ProblemKind(r) != "idempotency-key-reused" {
				t.Errorf("another quantity under the key = %d %s, want 422 idempotency-key-reused", r.Status, r.Body)
			}
		}
		if st := a.State(t, sku); st.Orders != 1 || st.Sold != 3 || st.Held != 0 {
			t.Errorf("state %+v, want one order of 3, nothing held", st)
		}
		systest.WaitSettled(t, a, sku)
	})
}

// heldConfirm keeps a confirm under key in flight after its ledger
// transaction committed, until freed.
type heldConfirm struct {
	sale.Ledger
	key       keys.ID
	once      sync.Once
	committed chan struct{}
	release   chan struct{}
	freeOnce  sync.Once
}

func (l *heldConfirm) ConfirmPart(ctx context.Context, holdID, buyer keys.ID, keep int64, req ledger.Request) (ledger.Order, error) {
	o, err := l.Ledger.ConfirmPart(ctx, holdID, buyer, keep, req)
	if req.Key == l.key && err == nil {
		first := false
		l.once.Do(func() { first = true })
		if first {
			close(l.committed)
			<-l.release
		}
	}
	return o, err
}

func (l *heldConfirm) free() { l.freeOnce.Do(func() { close(l.release) }) }

// confirmsJoined counts the goroutines of this process waiting in a sale
// flight for the answer of a copy of their confirm: a copy joined.
func confirmsJoined() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	joined := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		lines := bytes.SplitN(g, []byte("\n"), 3)
		if len(lines) == 3 && bytes.Contains(lines[1], []byte("/sale.(*inflight).do(")) &&
			bytes.Contains(g, []byte("gateway.(*Server).confirmHold(")) {
			joined++
		}
	}
	return joined
}
