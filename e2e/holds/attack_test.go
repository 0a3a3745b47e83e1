package holds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// A seat hold confirmed by a quantity naming all its seats is sold in
// Redis's seat map as a whole confirm's seats are: the consistency check
// finds nothing to repair.
func TestAttackConfirmPartSeatHoldSold(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 0, 1, 4)
		e.LoadSeats(t, sku, map[string]int{"A": 4})
		_, sh := e.SeatHold(t, sku, "s1", "bob", "A-01", "A-02")
		if r, got := confirmPart(t, e, sh.HoldID, "sc1", "bob", 2); r.Status != http.StatusCreated || got != 2 {
			t.Fatalf("confirm both seats by quantity = %d %s", r.Status, r.Body)
		}
		check := e.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/seats/check", nil, "")
		if check.Status != http.StatusOK || !strings.Contains(string(check.Body), `"differed":null`) {
			t.Errorf("Redis's seats and the ledger's disagree after the confirm: %d %s", check.Status, check.Body)
		}
	})
}

// A partial confirm's rest goes to the waitlist first: an entry it covers
// is offered, Redis gets nothing of it; an entry it does not cover stays
// in line and Redis gets the rest. Either way the gate agrees with the
// ledger once idle.
func TestAttackConfirmPartWaitlist(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 8, 2, 4)
		_, h1 := a.Hold(t, sku, "h1", "ann", 4, 0)
		_, h2 := a.Hold(t, sku, "h2", "amy", 4, 0)
		if r, _ := a.Join(t, sku, "w1", 1); r.Status != http.StatusCreated {
			t.Fatalf("join w1 = %d %s", r.Status, r.Body)
		}
		if r, got := confirmPart(t, b, h1.HoldID, "c1", "ann", 3); r.Status != http.StatusCreated || got != 3 {
			t.Fatalf("confirm 3 of 4 = %d %s", r.Status, r.Body)
		}
		w := a.Entry(t, sku, "w1")
		if w.State != "offered" || w.Offer == nil {
			t.Fatalf("w1 after the partial confirm: %+v, want offered", w)
		}
		systest.WaitSettled(t, a, sku)
		if st := a.State(t, sku); st.Sold != 3 || st.Held != 5 || st.RedisRemaining != 0 {
			t.Fatalf("after the rest went to w1: %+v, want 3 sold, 5 held, 0 in Redis", st)
		}
		// An entry for more than the rest is not offered: the rest goes to
		// Redis.
		if r, _ := a.Join(t, sku, "w2", 3); r.Status != http.StatusCreated {
			t.Fatalf("join w2 = %d %s", r.Status, r.Body)
		}
		if r, got := confirmPart(t, a, h2.HoldID, "c2", "amy", 2); r.Status != http.StatusCreated || got != 2 {
			t.Fatalf("confirm 2 of 4 = %d %s", r.Status, r.Body)
		}
		systest.WaitSettled(t, a, sku)
		if w := a.Entry(t, sku, "w2"); w.State != "waiting" {
			t.Errorf("w2: %+v, want still waiting", w)
		}
		if st := a.State(t, sku); st.Sold != 5 || st.Held != 1 || st.RedisRemaining != 2 {
			t.Fatalf("after the second partial confirm: %+v, want 5 sold, 1 held (the offer), 2 in Redis", st)
		}
		// The offer itself confirmed, then nothing is left over anywhere.
		if r := b.Act(t, "/v1/holds/"+w.Offer.HoldID+"/confirm", "c3", "w1"); r.Status != http.StatusCreated {
			t.Fatalf("confirm the offer = %d %s", r.Status, r.Body)
		}
		systest.WaitSettled(t, a, sku)
		systest.RedisConsistent(t, a, sku)
		rep := reportOf(t, b, sku.Program)
		if !rep.Balanced || len(rep.SKUs) != 1 || rep.SKUs[0].Sold != 6 || rep.SKUs[0].ConfirmedUnits != 6 ||
			rep.SKUs[0].GateDifference != 0 {
			t.Errorf("report after it all: %+v", rep)
		}
	})
}

// The per-buyer cap after a partial confirm: the buyer's count keeps the
// units kept, the rest may be held again, one over the cap is refused,
// and nothing is lost at the gate.
func TestAttackConfirmPartCap(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutCapped(t, sku, 2, 4)
		_, h := a.Hold(t, sku, "h1", "ann", 4, 0)
		if r, got := confirmPart(t, b, h.HoldID, "c1", "ann", 1); r.Status != http.StatusCreated || got != 1 {
			t.Fatalf("confirm 1 of 4 = %d %s", r.Status, r.Body)
		}
		if r, _ := b.Hold(t, sku, "h2", "ann", 3, 0); r.Status != http.StatusCreated {
			t.Fatalf("hold the 3 given back = %d %s", r.Status, r.Body)
		}
		if r := a.Buy(t, sku, "p1", "ann", 1); r.Status != http.StatusConflict || systest.ProblemKind(r) != "limit-reached" {
			t.Errorf("one over the cap = %d %s, want 409 limit-reached", r.Status, r.Body)
		}
		systest.WaitSettled(t, a, sku)
		if st := a.State(t, sku); st.Sold != 1 || st.Held != 3 || st.RedisRemaining != 96 {
			t.Errorf("state %+v, want 1 sold, 3 held, 96 in Redis", st)
		}
	})
}

// An access code's hold confirmed in part keeps its use (the order stands
// on the code); a refund of that order gives the use back, once.
func TestAttackConfirmPartCode(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 2, 4)
		a.PutPool(t, sku, "club", `{"allotment":6,"shards":1,"access":"code"}`)
		if r := a.Do(t, http.MethodPost, systest.AdminPath(sku)+"/pools/club/codes", nil,
			`{"codes":[{"code":"ONE-USE-CODE","max_uses":1}]}`); r.Status != http.StatusOK {
			t.Fatalf("POST codes = %d %s", r.Status, r.Body)
		}
		holdPath := systest.SKUPath(sku) + "/holds?pool=club"
		buyPath := systest.SKUPath(sku) + "/purchases?pool=club"
		r := a.Do(t, http.MethodPost, holdPath, map[string]string{"Idempotency-Key": "h1"},
			`{"buyer":"carl","quantity":4,"access_code":"ONE-USE-CODE"}`)
		if r.Status != http.StatusCreated {
			t.Fatalf("hold with the code = %d %s", r.Status, r.Body)
		}
		var h systest.HoldReply
		_ = json.Unmarshal(r.Body, &h)
		c, got := confirmPart(t, b, h.HoldID, "c1", "carl", 2)
		if c.Status != http.StatusCreated || got != 2 {
			t.Fatalf("confirm 2 of 4 = %d %s", c.Status, c.Body)
		}
		club := sku.InPool(keys.MustID("club"))
		systest.WaitSettled(t, a, club)
		if r := b.Do(t, http.MethodPost, buyPath, map[string]string{"Idempotency-Key": "p1"},
			`{"buyer":"dana","quantity":1,"access_code":"ONE-USE-CODE"}`); r.Status != http.StatusConflict ||
			systest.ProblemKind(r) != "access-code-used-up" {
			t.Errorf("the code's use after a partial confirm = %d %s, want 409 access-code-used-up", r.Status, r.Body)
		}
		if st := a.State(t, club); st.Sold != 2 || st.Held != 0 || st.RedisRemaining != 4 {
			t.Errorf("club after the partial confirm: %+v, want 2 sold, 4 in Redis", st)
		}
		if r := a.Act(t, "/v1/orders/"+systest.OrderID(c)+"/refund", "r1", "carl"); r.Status != http.StatusOK {
			t.Fatalf("refund = %d %s", r.Status, r.Body)
		}
		systest.WaitSettled(t, a, club)
		if r := b.Do(t, http.MethodPost, buyPath, map[string]string{"Idempotency-Key": "p2"},
			`{"buyer":"dana","quantity":1,"access_code":"ONE-USE-CODE"}`); r.Status != http.StatusCreated {
			t.Errorf("the use the refund gave back = %d %s, want 201", r.Status, r.Body)
		}
		if r := b.Do(t, http.MethodPost, buyPath, map[string]string{"Idempotency-Key": "p3"},
			`{"buyer":"eve","quantity":1,"access_code":"ONE-USE-CODE"}`); r.Status != http.StatusConflict {
			t.Errorf("a second use = %d %s, want 409", r.Status, r.Body)
		}
		systest.WaitSettled(t, a, club)
		systest.RedisConsistent(t, a, club)
	})
}

// Hostile confirm bodies: each a 4xx problem, nothing moved.
func TestAttackConfirmPartHostile(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 2, 4)
		_, h := e.Hold(t, sku, "h1", "ann", 4, 0)
		for i, body := range []string{
			`{"buyer":"ann","quantity":1.5}`,
			`{"buyer":"ann","quantity":1e3}`,
			`{"buyer":"ann","quantity":9223372036854775807}`,
			`{"buyer":"ann","quantity":9223372036854775808}`,
			`{"buyer":"ann","quantity":-9223372036854775808}`,
			`{"buyer":"ann","quantity":true}`,
			`{"buyer":"ann","quantity":[2]}`,
			`{"buyer":"ann","quantity":2,"quantity":3}`,
			`{"buyer":"ann","quantity":2,"seats":["A"]}`,
			`{"buyer":"bob","quantity":2}`,
			`{"buyer":"","quantity":2}`,
			`{"buyer":"a/b","quantity":2}`,
			`[]`,
			`{"buyer":"ann","quantity":2}x`,
		} {
			r := e.Do(t, http.MethodPost, "/v1/holds/"+h.HoldID+"/confirm", map[string]string{"Idempotency-Key": fmt.Sprintf("bad-%d", i)}, body)
			if r.Status < 400 || r.Status >= 500 || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/problem+json") {
				t.Errorf("confirm %s = %d %s, want a 4xx problem", body, r.Status, r.Body)
			}
		}
		for _, id := range []string{"nosuch", strings.Repeat("x", 65), "a.b"} {
			r := e.Do(t, http.MethodPost, "/v1/holds/"+id+"/confirm", map[string]string{"Idempotency-Key": "bad-id"}, `{"buyer":"ann","quantity":2}`)
			if r.Status < 400 || r.Status >= 500 {
				t.Errorf("confirm of hold %q = %d %s, want a 4xx", id, r.Status, r.Body)
			}
		}
		if st := e.State(t, sku); st.Held != 4 || st.Sold != 0 || st.RedisRemaining != 6 {
			t.Fatalf("after the refusals: %+v, want 4 held, 6 left", st)
		}
	})
}

// report is the JSON reconciliation report.
type report struct {
	Program  string
	Balanced bool
	SKUs     []struct {
		Ticket, Pool            string
		Total, Sold, Held, Open int64
		ConfirmedUnits          int64  `json:"confirmed_units"`
		HeldUnits               int64  `json:"held_units"`
		GateRemaining           *int64 `json:"gate_remaining"`
		GateDifference          int64  `json:"gate_difference"`
		Balanced                bool
	}
}

func reportOf(t *testing.T, e *systest.Env, program keys.ID) report {
	t.Helper()
	r := e.Do(t, http.MethodGet, "/v1/admin/programs/"+program.String()+"/report", nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("report = %d %s", r.Status, r.Body)
	}
	var rep report
	if err := json.Unmarshal(r.Body, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// retryShed sends a request again, with its key, while a busy ledger
// sheds it with 503 overloaded and Retry-After (outcome unchanged), as a
// client does, up to 30 times; then it gives the last answer. On a loaded
// make test machine the cancels' batcher shed 7 cancels this way: the
// attack is on each hold's fate, and a shed request has none yet.
func retryShed(send func() systest.Reply) systest.Reply {
	for i := 1; ; i++ {
		r := send()
		if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" || i == 30 {
			return r
		}
		time.Sleep(time.Duration(min(i, 10)) * 50 * time.Millisecond) // a client's back-off between retries
	}
}

// Partial confirms racing cancels, whole confirms and extensions of the
// same hold on two replicas: each hold has one fate, and the units add up.
func TestAttackConfirmPartRacesOthers(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		// 90 requests at once on 30 rows: on a 2-core machine running two
		// other test packages beside it, some PostgreSQL confirms queued
		// past the 5 s work timeout and answered 503 (CI, 2026-11-29).
		// What is under attack here is each hold's fate, not the time.
		slow := func(o *app.Options) { o.Sale.WorkTimeout = time.Minute }
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: slow})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Tune: slow})
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 120, 4, 4)
		const n = 30
		ids := make([]string, n)
		for i := range n {
			r, h := a.Hold(t, sku, fmt.Sprintf("h%d", i), fmt.Sprintf("b%d", i), 4, 0)
			if r.Status != http.StatusCreated {
				t.Fatalf("hold %d = %d %s", i, r.Status, r.Body)
			}
			ids[i] = h.HoldID
		}
		done := make(chan [3]systest.Reply, n)
		for i := range n {
			go func() {
				buyer := fmt.Sprintf("b%d", i)
				var out [3]systest.Reply
				ch := make(chan struct{}, 3)
				go func() {
					out[0] = retryShed(func() systest.Reply { r, _ := confirmPart(t, a, ids[i], "p", buyer, 1); return r })
					ch <- struct{}{}
				}()
				go func() {
					if i%2 == 0 {
						out[1] = retryShed(func() systest.Reply { return b.Act(t, "/v1/holds/"+ids[i]+"/cancel", "c", buyer) })
					} else {
						out[1] = retryShed(func() systest.Reply { return b.Act(t, "/v1/holds/"+ids[i]+"/confirm", "w", buyer) })
					}
					ch <- struct{}{}
				}()
				go func() {
					out[2] = retryShed(func() systest.Reply { r, _ := extend(t, b, ids[i], "x", buyer, 120); return r })
					ch <- struct{}{}
				}()
				for range 3 {
					<-ch
				}
				done <- out
			}()
		}
		for range n {
			out := <-done
			for _, r := range out {
				if r.Status >= 500 {
					t.Errorf("a 5xx: %d %s", r.Status, r.Body)
				}
			}
		}
		systest.WaitSettled(t, a, sku)
		systest.RedisConsistent(t, a, sku)
		rep := reportOf(t, b, sku.Program)
		if !rep.Balanced || rep.SKUs[0].Held != 0 || rep.SKUs[0].GateDifference != 0 {
			t.Errorf("report: %+v", rep)
		}
	})
}

// A held cart's line is refused a partial confirm and an extension (409
// in-cart), with nothing moved; the cart then confirms whole.
func TestAttackCartLineRefused(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		p, skus := systest.CartSKUs(t, e, [3]int64{10, 10, 10}, 0)
		r := e.Do(t, http.MethodPost, "/v1/programs/"+p.String()+"/cart-holds", map[string]string{"Idempotency-Key": "hc1"},
			systest.CartBody("ann", map[string]int64{"adult": 3, "child": 2}, "adult", "child"))
		if r.Status != http.StatusCreated {
			t.Fatalf("held cart = %d %s", r.Status, r.Body)
		}
		var c struct {
			CartID string `json:"cart_id"`
			Holds  []struct {
				HoldID string `json:"hold_id"`
			} `json:"holds"`
		}
		_ = json.Unmarshal(r.Body, &c)
		if len(c.Holds) != 2 {
			t.Fatalf("held cart %s", r.Body)
		}
		line := c.Holds[0].HoldID
		if r, _ := confirmPart(t, e, line, "c1", "ann", 1); r.Status != http.StatusConflict || systest.ProblemKind(r) != "in-cart" {
			t.Errorf("partial confirm of a line = %d %s, want 409 in-cart", r.Status, r.Body)
		}
		if r, _ := extend(t, e, line, "x1", "ann", 120); r.Status != http.StatusConflict || systest.ProblemKind(r) != "in-cart" {
			t.Errorf("extend a line = %d %s, want 409 in-cart", r.Status, r.Body)
		}
		if st := e.State(t, skus[0]); st.Held != 3 || st.Sold != 0 || st.RedisRemaining != 7 {
			t.Errorf("adult after the refusals: %+v", st)
		}
		if r := e.Act(t, "/v1/carts/"+c.CartID+"/confirm", "cc", "ann"); r.Status != http.StatusCreated {
			t.Fatalf("cart confirm = %d %s", r.Status, r.Body)
		}
		rep := reportOf(t, e, p)
		if !rep.Balanced {
			t.Errorf("report %+v", rep)
		}
	})
}

// The report: bad program ids and formats are 4xx problems; an unknown
// program is an empty report; a seated SKU, a pool and a waitlist offer
// balance; CSV by format or Accept has the JSON's lines.
func TestAttackReport(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 6, 2, 4)
		e.PutPool(t, sku, "fans", `{"allotment":2,"shards":1}`)
		seated := stock.SKU{Program: sku.Program, Ticket: keys.MustID("seated")}
		e.PutSKU(t, seated, 0, 1, 4)
		e.LoadSeats(t, seated, map[string]int{"A": 4})
		e.SeatHold(t, seated, "s1", "bob", "A-01", "A-02")
		_, h := e.Hold(t, sku, "h1", "ann", 4, 0)
		if r, _ := e.Join(t, sku, "w1", 1); r.Status != http.StatusCreated {
			t.Fatalf("join = %d %s", r.Status, r.Body)
		}
		if r, _ := confirmPart(t, e, h.HoldID, "c1", "ann", 2); r.Status != http.StatusCreated {
			t.Fatalf("confirm part = %d %s", r.Status, r.Body)
		}
		if r := e.Do(t, http.MethodPost, systest.SKUPath(sku)+"/purchases?pool=fans", map[string]string{"Idempotency-Key": "p1"},
			`{"buyer":"cat","quantity":1}`); r.Status != http.StatusCreated {
			t.Fatalf("pool buy = %d %s", r.Status, r.Body)
		}
		systest.WaitSettled(t, e, sku)
		rep := reportOf(t, e, sku.Program)
		if !rep.Balanced || len(rep.SKUs) != 3 {
			t.Fatalf("report %+v", rep)
		}
		for _, l := range rep.SKUs {
			if l.GateDifference != 0 || !l.Balanced {
				t.Errorf("line %+v", l)
			}
		}
		for _, path := range []string{
			"/v1/admin/programs/a.b/report",
			"/v1/admin/programs/" + strings.Repeat("p", 65) + "/report",
			"/v1/admin/programs/" + sku.Program.String() + "/report?format=CSV",
			"/v1/admin/programs/" + sku.Program.String() + "/report?format=",
		} {
			r := e.Do(t, http.MethodGet, path, nil, "")
			if r.Status < 400 || r.Status >= 500 || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/problem+json") {
				t.Errorf("%s = %d %s, want a 4xx problem", path, r.Status, r.Body)
			}
		}
		if r := e.Do(t, http.MethodGet, "/v1/admin/programs/nosuchprogram/report", nil, ""); r.Status != http.StatusOK ||
			!strings.Contains(string(r.Body), `"skus":[]`) {
			t.Errorf("unknown program = %d %s", r.Status, r.Body)
		}
		csv := e.Do(t, http.MethodGet, "/v1/admin/programs/"+sku.Program.String()+"/report", map[string]string{"Accept": "text/csv"}, "")
		if csv.Status != http.StatusOK || strings.Count(string(csv.Body), "\n") != 4 {
			t.Errorf("csv = %d %s", csv.Status, csv.Body)
		}
	})
}

// A waitlist offer lasts its offer window: its buyer cannot extend it (the
// next buyer in line waits for it): 409 hold-at-max-lifetime, nothing
// changes; its units come back once when it ends.
func TestAttackExtendOffer(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 2, 1, 2)
		_, h := e.Hold(t, sku, "h1", "ann", 2, 0)
		if r, _ := e.Join(t, sku, "w1", 1); r.Status != http.StatusCreated {
			t.Fatalf("join = %d %s", r.Status, r.Body)
		}
		if r := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "ann"); r.Status != http.StatusOK {
			t.Fatalf("cancel = %d %s", r.Status, r.Body)
		}
		w := e.Entry(t, sku, "w1")
		if w.Offer == nil {
			t.Fatalf("w1 %+v", w)
		}
		if r, _ := extend(t, e, w.Offer.HoldID, "x1", "w1", 3000); r.Status != http.StatusConflict || systest.ProblemKind(r) != "hold-at-max-lifetime" {
			t.Fatalf("extend an offer = %d %s, want 409 hold-at-max-lifetime", r.Status, r.Body)
		}
		if got, err := e.Ledger.HoldByID(context.Background(), keys.MustID(w.Offer.HoldID)); err != nil || !got.ExpiresAt.Equal(w.Offer.ExpiresAt) {
			t.Fatalf("the offer after the refusal: %+v, %v; want it until %v still", got, err, w.Offer.ExpiresAt)
		}
		if r := e.Act(t, "/v1/holds/"+w.Offer.HoldID+"/cancel", "c2", "w1"); r.Status != http.StatusOK {
			t.Fatalf("cancel the offer = %d %s", r.Status, r.Body)
		}
		systest.WaitSettled(t, e, sku)
		if st := e.State(t, sku); st.Held != 0 || st.RedisRemaining != 2 {
			t.Errorf("after: %+v", st)
		}
	})
}

// A retry of the hold request after its hold was confirmed in part (or
// cancelled) replays the hold and does not count the buyer again: the
// units given back can be held anew up to the cap.
func TestAttackRetryAfterPartCap(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		for _, how := range []string{"part", "cancel"} {
			sku := systest.NewSKU(t)
			sku.Ticket = keys.MustID(how)
			e.PutCapped(t, sku, 2, 4)
			r, h := e.Hold(t, sku, how+"-h1", "ann", 4, 0)
			if r.Status != http.StatusCreated {
				t.Fatalf("%s: hold = %d %s", how, r.Status, r.Body)
			}
			var keep int64
			if how == "part" {
				keep = 1
				if r, _ := confirmPart(t, e, h.HoldID, how+"-c1", "ann", 1); r.Status != http.StatusCreated {
					t.Fatalf("confirm 1 = %d %s", r.Status, r.Body)
				}
			} else if r := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", how+"-c1", "ann"); r.Status != http.StatusOK {
				t.Fatalf("cancel = %d %s", r.Status, r.Body)
			}
			systest.WaitSettled(t, e, sku)
			if r, again := e.Hold(t, sku, how+"-h1", "ann", 4, 0); r.Status != http.StatusCreated || again.HoldID != h.HoldID {
				t.Fatalf("%s: retry of the hold = %d %s", how, r.Status, r.Body)
			}
			if r, _ := e.Hold(t, sku, how+"-h2", "ann", 4-keep, 0); r.Status != http.StatusCreated {
				t.Errorf("%s: hold %d up to the cap after a retry = %d %s", how, 4-keep, r.Status, r.Body)
			}
		}
	})
}

// A waitlist offer confirmed in part: its rest goes to the next in line or
// to Redis, once, and the gate agrees with the ledger.
func TestAttackConfirmPartOfOffer(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 4, 2, 4)
		_, h := e.Hold(t, sku, "h1", "ann", 4, 0)
		if r, _ := e.Join(t, sku, "w1", 3); r.Status != http.StatusCreated {
			t.Fatalf("join = %d %s", r.Status, r.Body)
		}
		if r := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "ann"); r.Status != http.StatusOK {
			t.Fatalf("cancel = %d %s", r.Status, r.Body)
		}
		w := e.Entry(t, sku, "w1")
		if w.Offer == nil {
			t.Fatalf("w1 %+v", w)
		}
		systest.WaitSettled(t, e, sku)
		if st := e.State(t, sku); st.Held != 3 || st.RedisRemaining != 1 {
			t.Fatalf("after the offer: %+v", st)
		}
		if r, got := confirmPart(t, e, w.Offer.HoldID, "c2", "w1", 1); r.Status != http.StatusCreated || got != 1 {
			t.Fatalf("confirm 1 of the offer's 3 = %d %s", r.Status, r.Body)
		}
		if st := e.State(t, sku); st.Held != 0 || st.Sold != 1 || st.RedisRemaining != 3 {
			t.Errorf("after the partial confirm of the offer: %+v, want 1 sold, 3 in Redis", st)
		}
		systest.WaitSettled(t, e, sku)
	})
}

// A hold confirmed in part after its ticket's sale ended: the order
// stands, the rest is back in the ledger, and the ended gate sells none.
func TestAttackConfirmPartAfterEnd(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 10, 2, 4)
		_, h := e.Hold(t, sku, "h1", "ann", 4, 0)
		if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/end", nil, ""); r.Status != http.StatusOK {
			t.Fatalf("end = %d %s", r.Status, r.Body)
		}
		if r, got := confirmPart(t, e, h.HoldID, "c1", "ann", 1); r.Status != http.StatusCreated || got != 1 {
			t.Fatalf("confirm 1 after the end = %d %s", r.Status, r.Body)
		}
		if r, _ := extend(t, e, h.HoldID, "x1", "ann", 120); r.Status != http.StatusConflict {
			t.Errorf("extend a confirmed hold = %d %s", r.Status, r.Body)
		}
		systest.WaitFor(t, 10*time.Second, "restores", func() bool {
			p, err := e.Ledger.PendingRestores(context.Background(), 0, 1)
			return err == nil && len(p) == 0
		})
		if st := e.State(t, sku); st.Held != 0 || st.Sold != 1 {
			t.Errorf("after: %+v", st)
		}
		if r := e.Buy(t, sku, "p1", "bob", 1); r.Status < 400 || r.Status >= 500 {
			t.Errorf("buy after the end = %d %s", r.Status, r.Body)
		}
		rep := reportOf(t, e, sku.Program)
		if !rep.Balanced || rep.SKUs[0].GateDifference != 0 {
			t.Errorf("report %+v", rep)
		}
	})
}

// One key for an extension, then for a confirm of the same hold (and the
// other way round): the second is a reuse, 422, nothing moved.
func TestAttackKeyAcrossExtendConfirm(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		a, b := systest.Pair(t, driver)
		sku := systest.NewSKU(t)
		a.PutSKU(t, sku, 10, 2, 4)
		_, h1 := a.Hold(t, sku, "h1", "ann", 4, 0)
		_, h2 := a.Hold(t, sku, "h2", "ann", 4, 0)
		if r, _ := extend(t, a, h1.HoldID, "k1", "ann", 120); r.Status != http.StatusOK {
			t.Fatalf("extend = %d %s", r.Status, r.Body)
		}
		if r, _ := confirmPart(t, b, h1.HoldID, "k1", "ann", 2); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("confirm under the extension's key = %d %s, want 422", r.Status, r.Body)
		}
		if r := b.Act(t, "/v1/holds/"+h1.HoldID+"/confirm", "k1", "ann"); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("whole confirm under the extension's key = %d %s, want 422", r.Status, r.Body)
		}
		if r, _ := confirmPart(t, a, h2.HoldID, "k2", "ann", 2); r.Status != http.StatusCreated {
			t.Fatalf("confirm = %d %s", r.Status, r.Body)
		}
		if r, _ := extend(t, b, h2.HoldID, "k2", "ann", 120); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("extend under the confirm's key = %d %s, want 422", r.Status, r.Body)
		}
		if r, _ := extend(t, b, h1.HoldID, "h1", "ann", 120); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("extend under the hold's own key = %d %s, want 422", r.Status, r.Body)
		}
		if r, _ := confirmPart(t, b, h1.HoldID, "h2", "ann", 1); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("confirm under another hold's key = %d %s, want 422", r.Status, r.Body)
		}
		if st := a.State(t, sku); st.Held != 4 || st.Sold != 2 || st.RedisRemaining != 4 {
			t.Errorf("state %+v", st)
		}
	})
}

// Another buyer's confirm or extension of a hold, under a key that buyer
// used for a purchase, is 403 not-owner: API.md lists it among the
// refusals given before the key is looked up. The ledger claimed the key
// first and answered 422 idempotency-key-reused (helper-69 #5).
func TestNotOwnerBeforeTheKey(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 1, 4)
	r, h := e.Hold(t, sku, "h1", "ann", 1, 0)
	if r.Status != http.StatusCreated {
		t.Fatalf("hold = %d %s", r.Status, r.Body)
	}
	e.MustBuy(t, sku, "bobs", "bob", 1)
	for _, what := range []string{"confirm", "extend"} {
		body := `{"buyer":"bob"}`
		if what == "extend" {
			body = `{"buyer":"bob","ttl_seconds":60}`
		}
		got := e.Do(t, http.MethodPost, "/v1/holds/"+h.HoldID+"/"+what, map[string]string{"Idempotency-Key": "bobs"}, body)
		if got.Status != http.StatusForbidden || systest.ProblemKind(got) != "not-owner" {
			t.Errorf("bob's %s of ann's hold under his purchase's key = %d %s, want 403 not-owner", what, got.Status, got.Body)
		}
	}
	if g := e.Do(t, http.MethodGet, "/v1/holds/"+h.HoldID, nil, ""); !strings.Contains(string(g.Body), `"state":"held"`) {
		t.Errorf("ann's hold after bob's refused acts = %s", g.Body)
	}
}
