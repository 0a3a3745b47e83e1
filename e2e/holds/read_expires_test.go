package holds_test

// Found by TestModelConcurrent/two-primaries (seed 1796398119526381919):
// a confirm sent 60 ms before a hold's expiry read its clock, then waited
// for the ledger; meanwhile a read past the expiry answered "expired";
// then the confirm committed as made on time and the hold read
// "confirmed" ever after. A hold read expired must stay expired.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// stallClock is a ledger clock that stops the first reading from a
// function named in arm until release: that change has its time, before
// the hold's expiry, but has not reached the hold's row.
type stallClock struct {
	want    atomic.Pointer[string] // the ledger function to stop
	caught  chan time.Time
	release chan struct{}
}

func newStallClock() *stallClock {
	return &stallClock{caught: make(chan time.Time, 1), release: make(chan struct{})}
}

func (c *stallClock) arm(fn string) { c.want.Store(&fn) }

func (c *stallClock) now() time.Time {
	now := time.Now()
	fn := c.want.Load()
	if fn == nil || !calledFrom(*fn) || !c.want.CompareAndSwap(fn, nil) {
		return now
	}
	c.caught <- now
	<-c.release
	return now
}

// calledFrom reports whether ledger function fn is on the caller's stack.
func calledFrom(fn string) bool {
	pcs := make([]uintptr, 16)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, "ledger.(*Ledger)."+fn) {
			return true
		}
		if !more {
			return false
		}
	}
}

// A confirm (whole, batched; or of part of the hold), a cancel and an extension, each with
// its clock read before the hold's expiry and its row reached after a
// read answered "expired": the read's answer stands. The confirm is paid
// late (a new order; the hold stays expired), the cancel answers the
// hold expired, the extension is refused (410); the hold reads expired after
// each, and its units are back once.
func TestAHoldReadExpiredStaysExpired(t *testing.T) {
	cases := []struct {
		name, op, fn, body string
		want               int
	}{
		{"confirm", "confirm", "ConfirmBatch", `{"buyer":"ann"}`, http.StatusCreated},
		{"confirm-part", "confirm", "ConfirmPart", `{"buyer":"ann","quantity":1}`, http.StatusCreated},
		{"cancel", "cancel", "CancelBatch", `{"buyer":"ann"}`, http.StatusOK},
		{"extend", "extend", "Extend", `{"buyer":"ann","ttl_seconds":60}`, http.StatusGone},
	}
	systest.EachDriver(t, func(t *testing.T, driver string) {
		clock := newStallClock()
		e := systest.Start(t, systest.Options{Driver: driver, Tune: func(o *app.Options) {
			o.Ledger.Now = clock.now
			o.Sale.LatePayment = time.Minute
		}}) // no sweeper: only a read can expire the hold
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 1, 4)
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				r, h := e.Hold(t, sku, "h-"+c.name, "ann", 2, 1)
				if r.Status != http.StatusCreated {
					t.Fatalf("hold = %d %s", r.Status, r.Body)
				}
				state := func() string { return e.HoldState(t, h.HoldID) }
				clock.arm(c.fn)
				done := make(chan systest.Reply, 1)
				go func() {
					done <- e.Do(t, http.MethodPost, "/v1/holds/"+h.HoldID+"/"+c.op,
						map[string]string{"Idempotency-Key": "op-" + c.name}, c.body)
				}()
				if at := <-clock.caught; !at.Before(h.ExpiresAt) {
					close(clock.release)
					t.Fatalf("the %s read its clock at %v, after the expiry %v: nothing raced", c.op, at, h.ExpiresAt)
				}
				systest.WaitFor(t, 5*time.Second, "the expiry", func() bool { return time.Now().After(h.ExpiresAt) })
				if s := state(); s != "expired" {
					t.Fatalf("a read past the expiry = %q", s)
				}
				clock.release <- struct{}{}
				r = <-done
				if r.Status != c.want {
					t.Errorf("%s after the read = %d %s, want %d", c.op, r.Status, r.Body, c.want)
				}
				if c.op == "cancel" && !strings.Contains(string(r.Body), `"expired"`) {
					t.Errorf("cancel after the read = %s, want the hold expired", r.Body)
				}
				if s := state(); s != "expired" {
					t.Errorf("the hold reads %q after the %s, want expired as read before it", s, c.op)
				}
				if st, err := e.Ledger.SKU(t.Context(), sku); err != nil || st.Held != 0 {
					t.Errorf("ledger after the %s: %+v %v, want nothing held", c.op, st, err)
				}
			})
		}
		// Three units sold, by the late payments (2 and 1); every other
		// unit back.
		if st, err := e.Ledger.SKU(t.Context(), sku); err != nil || st.Sold != 3 || st.Remaining() != 7 {
			t.Errorf("ledger: %+v %v, want 3 sold and 7 remaining", st, err)
		}
		systest.WaitSettled(t, e, sku)
	})
}

// noExpiry is a ledger that takes no expiry (a failover, a program on
// the move).
type noExpiry struct{ sale.Ledger }

func (noExpiry) ExpireHold(context.Context, keys.ID) (ledger.Hold, bool, error) {
	return ledger.Hold{}, false, errors.New("no write now")
}

// A read of a hold past its expiry when the ledger takes no write is
// answered from the clock, 200 "expired", as before reads expired holds:
// never a 503 for a read the ledger can answer.
func TestAHoldReadPastItsExpiryWithoutWrites(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.Start(t, systest.Options{Driver: driver, Tune: func(o *app.Options) {
			o.WrapLedger = func(l sale.Ledger) sale.Ledger { return noExpiry{l} }
		}})
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 1, 4)
		r, h := e.Hold(t, sku, "h1", "ann", 2, 1)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		systest.WaitFor(t, 5*time.Second, "the expiry", func() bool { return time.Now().After(h.ExpiresAt) })
		r = e.Do(t, http.MethodGet, "/v1/holds/"+h.HoldID, nil, "")
		var got systest.HoldReply
		_ = json.Unmarshal(r.Body, &got)
		if r.Status != http.StatusOK || got.State != "expired" {
			t.Fatalf("read past the expiry = %d %s, want 200 expired", r.Status, r.Body)
		}
		if cur, err := e.Ledger.HoldByID(t.Context(), keys.MustID(h.HoldID)); err != nil || cur.State != ledger.Held {
			t.Fatalf("ledger row %+v %v, want still held (no expiry taken)", cur, err)
		}
	})
}

// A read of one line of a cart past its expiry leaves the line to its
// cart, which ends whole: a cancel of the cart then ends every line alike.
func TestACartLineReadPastItsExpiry(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver) // no sweeper
		p, _ := systest.CartSKUs(t, e, [3]int64{10, 10, 10}, 6)
		body := strings.TrimSuffix(systest.CartBody("ann", map[string]int64{"adult": 1, "child": 1}, "adult", "child"), "}") + `,"ttl_seconds":1}`
		r := e.Do(t, http.MethodPost, "/v1/programs/"+p.String()+"/cart-holds", map[string]string{"Idempotency-Key": "c1"}, body)
		var c struct {
			CartID    string              `json:"cart_id"`
			Holds     []systest.HoldReply `json:"holds"`
			ExpiresAt time.Time           `json:"expires_at"`
		}
		if err := json.Unmarshal(r.Body, &c); r.Status != http.StatusCreated || err != nil || len(c.Holds) != 2 {
			t.Fatalf("cart = %d %s (%v)", r.Status, r.Body, err)
		}
		systest.WaitFor(t, 5*time.Second, "the expiry", func() bool { return time.Now().After(c.ExpiresAt) })
		if r := e.Do(t, http.MethodGet, "/v1/holds/"+c.Holds[0].HoldID, nil, ""); r.Status != http.StatusOK {
			t.Fatalf("read of a line = %d %s", r.Status, r.Body)
		}
		if r := e.Act(t, "/v1/carts/"+c.CartID+"/cancel", "x1", "ann"); r.Status != http.StatusOK {
			t.Fatalf("cart cancel = %d %s", r.Status, r.Body)
		}
		var states []string
		for _, h := range c.Holds {
			cur, err := e.Ledger.HoldByID(t.Context(), keys.MustID(h.HoldID))
			if err != nil {
				t.Fatal(err)
			}
			states = append(states, cur.State)
		}
		if states[0] != states[1] {
			t.Errorf("the cart's lines ended %v, want alike", states)
		}
		t.Log(fmt.Sprint("lines ended ", states))
	})
}
