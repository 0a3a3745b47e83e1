package model_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// TestModelResale runs seeded random sequences of purchases, holds (with
// and without a device fingerprint, under the program's hold budgets),
// confirms, cancels, refunds, resale listings and withdrawals over two
// replicas on one ledger, against a reference model. Settling resales is
// the sweeper's and asynchronous, so the model reads back each listing's
// sold units (and its seller's order) rather than predicting when; what
// it predicts exactly is every answer's status and kind: a take is
// granted iff the SKU's free units (the organizer's total and the listed
// units, less sold and held) cover it, a hold iff also neither its buyer
// nor its device would pass its budget, a listing iff the order has the
// units unlisted, a refund iff the order has nothing listed. After every
// step the ledger must agree: sold + held <= total, the organizer's total
// unchanged, sold = the standing orders' units, listed = the open
// listings' unsold units; at the end each listing's listing.sold events
// add up to its sold units (the seller refunded once per ticket), the
// report is balanced and Redis agrees with the ledger.
//
// STOCKGATE_MODEL_SEED replays a sequence, STOCKGATE_MODEL_STEPS sets the
// steps (default 200 per ledger: TestModelConcurrent takes resale's
// operations through 5,000 a shape beside it).
func TestModelResale(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	steps, seed := runOf(200, 4)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		t.Logf("seed %d: STOCKGATE_MODEL_SEED=%d go test -run 'TestModelResale/%s' ./e2e/model reproduces it", seed, seed, driver)
		r := newResaleModel(t, driver, seed)
		for i := range steps {
			r.step = i
			r.sync()
			r.do()
			r.check()
		}
		r.finish()
		t.Logf("%d steps: %v", steps, r.ops)
	})
}

// Budgets of the resale model's program.
const (
	rBuyerBudget  = 5
	rDeviceBudget = 6
	rTotal        = 20
)

type rSKU struct {
	sku        stock.SKU
	sold, held int64
	listed     int64 // the open listings' unsold units, as last read
	alongside  bool
}

func (s *rSKU) free() int64 { return rTotal + s.listed - s.sold - s.held }

type rOrder struct {
	id, buyer string
	sku       *rSKU
	q         int64
	resold    int64 // units its listings sold (settled)
	refunded  bool
}

type rHold struct {
	id, buyer, device string
	sku               *rSKU
	q                 int64
	live              bool
}

type rListing struct {
	id            string
	order         *rOrder
	q, sold, gone int64 // gone: withdrawn
	open          bool
}

type resaleModel struct {
	t        *testing.T
	rng      *rand.Rand
	step     int
	envs     []*systest.Env
	skus     []*rSKU
	orders   []*rOrder
	holds    []*rHold
	listings []*rListing
	keys     int
	ops      map[string]int
}

func newResaleModel(t *testing.T, driver string, seed uint64) *resaleModel {
	dsn := systest.LedgerDSN(t, driver)
	r := &resaleModel{t: t, rng: rand.New(rand.NewPCG(seed, 29)), ops: map[string]int{}}
	for i := range 2 {
		r.envs = append(r.envs, systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Sweep: i == 0,
			Tune: func(o *app.Options) { o.Sale.SweepEvery = 50 * time.Millisecond }}))
	}
	program := keys.MustID(testenv.ID(t, "r"))
	for i, mode := range []string{"first", "alongside"} {
		s := &rSKU{sku: stock.SKU{Program: program, Ticket: keys.MustID(fmt.Sprintf("t%d", i))}, alongside: mode == "alongside"}
		if got := r.envs[0].Do(t, http.MethodPut, systest.AdminPath(s.sku), nil,
			fmt.Sprintf(`{"total":%d,"shards":%d,"max_per_order":4,"resale":%q}`, rTotal, 1+i, mode)); got.Status != http.StatusOK {
			t.Fatalf("put sku = %d %s", got.Status, got.Body)
		}
		r.skus = append(r.skus, s)
	}
	if got := r.envs[0].Do(t, http.MethodPut, "/v1/admin/programs/"+program.String(), nil,
		fmt.Sprintf(`{"per_buyer":0,"hold_budget":%d,"device_hold_budget":%d}`, rBuyerBudget, rDeviceBudget)); got.Status != http.StatusOK {
		t.Fatalf("put program = %d %s", got.Status, got.Body)
	}
	return r
}

func (r *resaleModel) fail(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("step %d: "+format, append([]any{r.step}, args...)...)
}

func (r *resaleModel) env() *systest.Env { return r.envs[r.rng.IntN(len(r.envs))] }

func (r *resaleModel) key() string {
	r.keys++
	return fmt.Sprintf("rk%d", r.keys)
}

func (r *resaleModel) post(path, key, body string, header ...string) systest.Reply {
	h := map[string]string{"Idempotency-Key": key}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	return r.env().Do(r.t, http.MethodPost, path, h, body)
}

// held is what buyer, or device, holds now across the program.
func (r *resaleModel) held(buyer, device string) (byBuyer, byDevice int64) {
	for _, h := range r.holds {
		if !h.live {
			continue
		}
		if h.buyer == buyer {
			byBuyer += h.q
		}
		if device != "" && h.device == device {
			byDevice += h.q
		}
	}
	return byBuyer, byDevice
}

func (r *resaleModel) do() {
	switch n := r.rng.IntN(100); {
	case n < 25:
		r.take(false)
	case n < 45:
		r.take(true)
	case n < 55:
		r.endHold("confirm")
	case n < 62:
		r.endHold("cancel")
	case n < 77:
		r.list()
	case n < 85:
		r.withdraw()
	default:
		r.refund()
	}
}

// take buys or holds 1..4 of a SKU, as a random buyer (a hold sometimes
// from one of two devices): granted iff the free units cover it and, for
// a hold, neither budget is passed.
func (r *resaleModel) take(hold bool) {
	s := r.skus[r.rng.IntN(len(r.skus))]
	buyer := fmt.Sprintf("b%d", r.rng.IntN(6))
	device := []string{"", "", "phone-1", "phone-2"}[r.rng.IntN(4)]
	q := 1 + r.rng.Int64N(4)
	path, key := systest.SKUPath(s.sku)+"/purchases", r.key()
	op := "buy"
	if hold {
		path, op = systest.SKUPath(s.sku)+"/holds", "hold"
	}
	body := fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, buyer, q)
	overBudget := false
	if hold {
		b, d := r.held(buyer, device)
		overBudget = b+q > rBuyerBudget || (device != "" && d+q > rDeviceBudget)
	}
	stockOK := q <= s.free()
	r.ops[op]++
	deadline := time.Now().Add(3 * time.Second)
	for {
		got := r.post(path, key, body, "Buyer-Fingerprint", device)
		kind := systest.ProblemKind(got)
		switch {
		case overBudget && kind == "hold-budget-reached" && got.Status == http.StatusConflict:
			r.ops[op+"-over-budget"]++
			return
		case !stockOK && kind == "sold-out" && got.Status == http.StatusConflict:
			r.ops[op+"-sold-out"]++
			return
		case stockOK && !overBudget && got.Status == http.StatusCreated:
			var v struct {
				OrderID string `json:"order_id"`
				HoldID  string `json:"hold_id"`
			}
			_ = json.Unmarshal(got.Body, &v)
			if hold {
				s.held += q
				r.holds = append(r.holds, &rHold{id: v.HoldID, buyer: buyer, device: device, sku: s, q: q, live: true})
			} else {
				s.sold += q
				r.orders = append(r.orders, &rOrder{id: v.OrderID, buyer: buyer, sku: s, q: q})
			}
			return
		case stockOK && kind == "sold-out" && time.Now().Before(deadline):
			// A replica's sold-out flag from before a listing or a return
			// on the other replica lives for its TTL: the same request
			// again, once it has passed.
			time.Sleep(50 * time.Millisecond) // poll interval
			continue
		}
		r.fail("POST %s %s (fingerprint %q) = %d %s; want stock ok %v, over budget %v (free %d)",
			path, body, device, got.Status, got.Body, stockOK, overBudget, s.free())
	}
}

// endHold confirms or cancels a live hold.
func (r *resaleModel) endHold(action string) {
	var live []*rHold
	for _, h := range r.holds {
		if h.live {
			live = append(live, h)
		}
	}
	if len(live) == 0 {
		return
	}
	h := live[r.rng.IntN(len(live))]
	r.ops[action]++
	got := r.post("/v1/holds/"+h.id+"/"+action, r.key(), fmt.Sprintf(`{"buyer":%q}`, h.buyer))
	want := map[string]int{"confirm": http.StatusCreated, "cancel": http.StatusOK}[action]
	if got.Status != want {
		r.fail("%s hold %s = %d %s", action, h.id, got.Status, got.Body)
	}
	h.live = false
	h.sku.held -= h.q
	if action == "confirm" {
		var v struct {
			OrderID string `json:"order_id"`
		}
		_ = json.Unmarshal(got.Body, &v)
		h.sku.sold += h.q
		r.orders = append(r.orders, &rOrder{id: v.OrderID, buyer: h.buyer, sku: h.sku, q: h.q})
	}
}

// unlisted is what an order has not listed (open listings' unsold units
// are still its own, and listed).
func (r *resaleModel) unlisted(o *rOrder) int64 {
	n := o.q
	for _, x := range r.listings {
		if x.open && x.order == o {
			n -= x.q - x.sold
		}
	}
	return n
}

// list lists 1..(more than) an order's unlisted units: 201 iff it has them.
func (r *resaleModel) list() {
	var standing []*rOrder
	for _, o := range r.orders {
		if !o.refunded && o.q > 0 {
			standing = append(standing, o)
		}
	}
	if len(standing) == 0 {
		return
	}
	o := standing[r.rng.IntN(len(standing))]
	q := 1 + r.rng.Int64N(o.q+1)
	r.ops["list"]++
	got := r.post("/v1/orders/"+o.id+"/resale", r.key(), fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, o.buyer, q))
	if r.resoldWhole(o, q, got) {
		r.ops["list-resold-whole"]++
		return
	}
	if q > r.unlisted(o) {
		if got.Status != http.StatusUnprocessableEntity {
			r.fail("list %d of order %s with %d unlisted = %d %s, want 422", q, o.id, r.unlisted(o), got.Status, got.Body)
		}
		r.ops["list-refused"]++
		return
	}
	if got.Status != http.StatusCreated {
		r.fail("list %d of order %s with %d unlisted = %d %s", q, o.id, r.unlisted(o), got.Status, got.Body)
	}
	var v struct {
		ListingID string `json:"listing_id"`
	}
	_ = json.Unmarshal(got.Body, &v)
	r.listings = append(r.listings, &rListing{id: v.ListingID, order: o, q: q, open: true})
	o.sku.listed += q
}

// withdraw takes an open listing back: 200 with its unsold units, or 409
// listing-selling while some are being bought or not settled yet.
func (r *resaleModel) withdraw() {
	var open []*rListing
	for _, x := range r.listings {
		if x.open {
			open = append(open, x)
		}
	}
	if len(open) == 0 {
		return
	}
	x := open[r.rng.IntN(len(open))]
	r.ops["withdraw"]++
	got := r.post("/v1/listings/"+x.id+"/withdraw", r.key(), fmt.Sprintf(`{"buyer":%q}`, x.order.buyer))
	switch {
	case got.Status == http.StatusConflict && systest.ProblemKind(got) == "listing-selling":
		r.ops["withdraw-selling"]++
		return
	case got.Status == http.StatusConflict && systest.ProblemKind(got) == "listing-ended":
		// Sold out: its last units' sales settled since the step read
		// them back (in the withdrawal's own transaction, rolled back
		// with it, the sweeper settles them again within a sweep).
		deadline := time.Now().Add(10 * time.Second)
		for r.sync(); x.open && time.Now().Before(deadline); r.sync() {
			time.Sleep(20 * time.Millisecond) // poll interval
		}
		if x.open {
			r.fail("withdraw %s = %d %s, but it is open with %d of %d sold", x.id, got.Status, got.Body, x.sold, x.q)
		}
		r.ops["withdraw-sold-out"]++
		return
	case got.Status != http.StatusOK:
		r.fail("withdraw %s = %d %s", x.id, got.Status, got.Body)
	}
	var v struct {
		Sold, Withdrawn int64
		State           string
	}
	_ = json.Unmarshal(got.Body, &v)
	if v.State != ledger.Withdrawn || v.Sold+v.Withdrawn != x.q {
		r.fail("withdraw %s = %s", x.id, got.Body)
	}
	r.settled(x, v.Sold)
	x.open, x.gone = false, v.Withdrawn
	x.order.sku.listed -= v.Withdrawn
}

// settled records that listing x has sold units settled: its seller's
// order gave them up.
func (r *resaleModel) settled(x *rListing, sold int64) {
	if sold < x.sold {
		r.fail("listing %s sold %d, then %d", x.id, x.sold, sold)
	}
	y := sold - x.sold
	x.sold = sold
	x.order.q -= y
	x.order.resold += y
	x.order.sku.sold -= y
	x.order.sku.listed -= y
	if x.sold == x.q {
		x.open = false
	}
	if x.order.q == 0 {
		// All its tickets resold: the order is given up whole (its
		// listing.sold events are the seller's refund; 409 order-resold
		// to a refund, a transfer or a listing).
		x.order.refunded = true
	}
}

// resoldWhole reports that got refused an action on o of q units (0: the
// whole order) as resold (409 order-resold): every unit of it was resold
// (the sweeper settled its listings' last sales since the step read them
// back), or q is more than stands and its resold units make up the rest.
// It fails the run if, read back now, neither is so. (Settling only moves
// units from standing to resold, so what was so when the server answered
// is so after the read.)
func (r *resaleModel) resoldWhole(o *rOrder, q int64, got systest.Reply) bool {
	if got.Status != http.StatusConflict || systest.ProblemKind(got) != "order-resold" {
		return false
	}
	r.sync()
	if !o.refunded && (q <= o.q || o.resold == 0 || q > o.q+o.resold) {
		r.fail("order %s answered %d %s to %d, but it stands with %d (%d resold)", o.id, got.Status, got.Body, q, o.q, o.resold)
	}
	return true
}

// refund refunds a standing order: 409 order-listed while it has units
// on an open listing.
func (r *resaleModel) refund() {
	var standing []*rOrder
	for _, o := range r.orders {
		if !o.refunded && o.q > 0 {
			standing = append(standing, o)
		}
	}
	if len(standing) == 0 {
		return
	}
	o := standing[r.rng.IntN(len(standing))]
	r.ops["refund"]++
	got := r.post("/v1/orders/"+o.id+"/refund", r.key(), fmt.Sprintf(`{"buyer":%q}`, o.buyer))
	if r.resoldWhole(o, 0, got) {
		r.ops["refund-resold-whole"]++
		return
	}
	if r.unlisted(o) < o.q {
		if got.Status == http.StatusOK {
			// The sweeper may have settled the listing's last units since
			// the step read them back: then the order has nothing listed.
			r.sync()
		}
		if r.unlisted(o) < o.q {
			if got.Status != http.StatusConflict || systest.ProblemKind(got) != "order-listed" {
				r.fail("refund of order %s with units listed = %d %s, want 409 order-listed", o.id, got.Status, got.Body)
			}
			r.ops["refund-listed"]++
			return
		}
	}
	if got.Status != http.StatusOK {
		r.fail("refund %s = %d %s", o.id, got.Status, got.Body)
	}
	o.refunded = true
	o.sku.sold -= o.q
}

// sync reads back what the sweeper settled: each open listing's sold.
func (r *resaleModel) sync() {
	ctx := context.Background()
	for _, x := range r.listings {
		if !x.open {
			continue
		}
		got, err := r.envs[0].Ledger.ListingByID(ctx, keys.MustID(x.id))
		if err != nil {
			r.fail("listing %s: %v", x.id, err)
		}
		r.settled(x, got.Sold)
	}
}

// check compares the ledger with the model, after reading back what
// settled since the step began. A settle may commit between the read-back
// and the ledger's reads: a mismatch is read again a few times before it
// fails (settles are seconds apart per SKU).
func (r *resaleModel) check() {
	ctx := context.Background()
	l := r.envs[0].Ledger
	for _, s := range r.skus {
		var diff string
		for range 5 {
			r.sync()
			st, err := l.SKU(ctx, s.sku)
			if err != nil {
				r.fail("sku: %v", err)
			}
			var orderUnits int64
			for _, o := range r.orders {
				if o.sku == s && !o.refunded {
					orderUnits += o.q
				}
			}
			_, units, err := l.OrderTotals(ctx, s.sku)
			if err != nil {
				r.fail("order totals: %v", err)
			}
			if st.Total-st.Listed == rTotal && st.Sold+st.Held <= st.Total && st.Sold == s.sold && st.Held == s.held &&
				st.Listed == s.listed && units == orderUnits {
				diff = ""
				break
			}
			diff = fmt.Sprintf("%s: ledger total %d listed %d sold %d held %d, order units %d; model sold %d held %d listed %d, order units %d",
				s.sku, st.Total, st.Listed, st.Sold, st.Held, units, s.sold, s.held, s.listed, orderUnits)
		}
		if diff != "" {
			r.fail("%s", diff)
		}
	}
}

// finish waits for every sale to settle, then checks the events, the
// report and Redis.
func (r *resaleModel) finish() {
	// Holds still open may hold listed units (a withdrawal leaves those
	// to their checkout): they end first.
	for _, h := range r.holds {
		if h.live {
			got := r.post("/v1/holds/"+h.id+"/cancel", r.key(), fmt.Sprintf(`{"buyer":%q}`, h.buyer))
			if got.Status != http.StatusOK {
				r.fail("cancel hold %s = %d %s", h.id, got.Status, got.Body)
			}
			h.live = false
			h.sku.held -= h.q
		}
	}
	// Withdraw what is left (a listing whose sales have not settled yet is
	// withdrawn once they have).
	systest.WaitFor(r.t, 30*time.Second, "every listing withdrawn or sold", func() bool {
		r.sync()
		for _, x := range r.listings {
			if x.open {
				r.withdrawQuiet(x)
			}
		}
		return !slices.ContainsFunc(r.listings, func(x *rListing) bool { return x.open })
	})
	r.check()
	ctx := context.Background()
	program := r.skus[0].sku.Program
	soldEvents := map[string]int64{}
	for after := int64(0); ; {
		events, err := r.envs[0].Ledger.Events(ctx, program, after, 1000)
		if err != nil {
			r.fail("events: %v", err)
		}
		if len(events) == 0 {
			break
		}
		for _, e := range events {
			if e.Type == ledger.EventListingSold {
				soldEvents[e.Subject.String()] += e.Quantity
			}
			after = e.Seq
		}
	}
	for _, x := range r.listings {
		if soldEvents[x.id] != x.sold {
			r.fail("listing %s: listing.sold events for %d units, %d sold", x.id, soldEvents[x.id], x.sold)
		}
	}
	rep := r.envs[1].Do(r.t, http.MethodGet, "/v1/admin/programs/"+program.String()+"/report", nil, "")
	var report struct {
		Balanced bool `json:"balanced"`
	}
	if err := json.Unmarshal(rep.Body, &report); err != nil || !report.Balanced {
		r.fail("report %s: not balanced (%v)", rep.Body, err)
	}
	for _, s := range r.skus {
		systest.WaitSettled(r.t, r.envs[0], s.sku)
	}
}

func (r *resaleModel) withdrawQuiet(x *rListing) {
	got := r.post("/v1/listings/"+x.id+"/withdraw", r.key(), fmt.Sprintf(`{"buyer":%q}`, x.order.buyer))
	if got.Status != http.StatusOK {
		return
	}
	var v struct{ Sold, Withdrawn int64 }
	_ = json.Unmarshal(got.Body, &v)
	r.settled(x, v.Sold)
	x.open, x.gone = false, v.Withdrawn
	x.order.sku.listed -= v.Withdrawn
}
