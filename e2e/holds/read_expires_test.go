package holds_test

// Found by TestModelConcurrent/two-primaries (seed 1796398119526381919):
// a confirm sent 60 ms before a hold's expiry read its clock, then waited
// for the ledger; meanwhile a read past the expiry answered "expired";
// then the confirm committed as made on time and the hold read
// "confirmed" ever after. A hold read expired must stay expired.

import (
	"encoding/json"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/internal/systest"
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
				state := func() string {
					r := e.Do(t, http.MethodGet, "/v1/holds/"+h.HoldID, nil, "")
					var got systest.HoldReply
					_ = json.Unmarshal(r.Body, &got)
					return got.State
				}
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
