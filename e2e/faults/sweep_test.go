package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// sweepRoute is one write route of the sweep: prep makes what it acts on
// (through the healthy replica) and returns the request.
type sweepRoute struct {
	name string
	prep func(t *testing.T, n int) (method, path, body string)
}

// world is what a request can move, read from the ledger: the program's
// report and its events. Two equal worlds mean nothing moved.
type world struct {
	Report []ledger.StockReport
	Events int
}

func worldOf(t *testing.T, e *systest.Env, program keys.ID) world {
	t.Helper()
	ctx := context.Background()
	rep, err := e.Ledger.Report(ctx, program)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := e.Ledger.Events(ctx, program, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return world{rep, len(evs)}
}

// Answers never lie (issue 39): every write route, buyers' and admins',
// sent to a replica whose ledger link is cut, then to one with Redis
// down, answers a 4xx that changed nothing, a 2xx that stands, or a 5xx
// whose problem says its outcome: unchanged (and nothing moved) or
// unknown; the same request with the same key on the other replica then
// answers what happened (2xx or 4xx, never a second movement: a third
// send replays it), and Redis agrees with the ledger afterwards.
func TestWriteRoutesNeverLie(t *testing.T) {
	systest.FullTier(t)
	c := testenv.NewCluster(t, testenv.ClusterOptions{ReplicasPerMaster: 1})
	direct := testenv.PostgresURL(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := testenv.StartProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr
	tune := func(o *app.Options) {
		o.Sale.Breaker.OpenFor = 300 * time.Millisecond
		o.Sale.LatePayment = time.Minute
	}
	a := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: u.String(), Cluster: c, Tune: tune})
	// b runs the sweeper: it finishes the restores a left owed.
	b := systest.Start(t, systest.Options{Driver: ledger.Postgres, DSN: direct, Cluster: c, Sweep: true, Tune: tune})
	sku := systest.NewSKU(t)
	other := stock.SKU{Program: sku.Program, Ticket: keys.MustID("other")}
	// A resale SKU per fault, sold only before its listings: no settle
	// moves the ledger while a fault's answers are checked.
	resales := []stock.SKU{{Program: sku.Program, Ticket: keys.MustID("resale0")}, {Program: sku.Program, Ticket: keys.MustID("resale1")}}
	var resale stock.SKU
	for _, s := range append([]stock.SKU{sku, other}, resales...) {
		b.PutSKU(t, s, 400, 2, 4)
	}
	program := sku.Program.String()
	buy := func(t *testing.T, on stock.SKU, buyer string, q int64) string {
		r := b.Buy(t, on, "prep-"+buyer, buyer, q)
		if r.Status != http.StatusCreated {
			t.Fatalf("prep purchase = %d %s", r.Status, r.Body)
		}
		return systest.OrderID(r)
	}
	hold := func(t *testing.T, buyer string, q int64) string {
		r, h := b.Hold(t, sku, "prep-"+buyer, buyer, q, 120)
		if r.Status != http.StatusCreated {
			t.Fatalf("prep hold = %d %s", r.Status, r.Body)
		}
		return h.HoldID
	}
	routes := []sweepRoute{
		{"purchase", func(t *testing.T, n int) (string, string, string) {
			return http.MethodPost, systest.SKUPath(sku) + "/purchases", fmt.Sprintf(`{"buyer":"pu%d","quantity":2}`, n)
		}},
		{"hold", func(t *testing.T, n int) (string, string, string) {
			return http.MethodPost, systest.SKUPath(sku) + "/holds", fmt.Sprintf(`{"buyer":"ho%d","quantity":2,"ttl_seconds":120}`, n)
		}},
		{"confirm", func(t *testing.T, n int) (string, string, string) {
			buyer := fmt.Sprintf("co%d", n)
			return http.MethodPost, "/v1/holds/" + hold(t, buyer, 2) + "/confirm", fmt.Sprintf(`{"buyer":%q}`, buyer)
		}},
		{"confirm part", func(t *testing.T, n int) (string, string, string) {
			buyer := fmt.Sprintf("cp%d", n)
			return http.MethodPost, "/v1/holds/" + hold(t, buyer, 3) + "/confirm", fmt.Sprintf(`{"buyer":%q,"quantity":1}`, buyer)
		}},
		{"cancel", func(t *testing.T, n int) (string, string, string) {
			buyer := fmt.Sprintf("ca%d", n)
			return http.MethodPost, "/v1/holds/" + hold(t, buyer, 2) + "/cancel", fmt.Sprintf(`{"buyer":%q}`, buyer)
		}},
		{"extend", func(t *testing.T, n int) (string, string, string) {
			buyer := fmt.Sprintf("ex%d", n)
			return http.MethodPost, "/v1/holds/" + hold(t, buyer, 1) + "/extend", fmt.Sprintf(`{"buyer":%q,"ttl_seconds":300}`, buyer)
		}},
		{"refund", func(t *testing.T, n int) (string, string, string) {
			buyer := fmt.Sprintf("rf%d", n)
			return http.MethodPost, "/v1/orders/" + buy(t, sku, buyer, 2) + "/refund", fmt.Sprintf(`{"buyer":%q}`, buyer)
		}},
		{"transfer", func(t *testing.T, n int) (string, string, string) {
			buyer := fmt.Sprintf("tr%d", n)
			return http.MethodPost, "/v1/orders/" + buy(t, resale, buyer, 3) + "/transfer", fmt.Sprintf(`{"buyer":%q,"to":"to%d","quantity":1}`, buyer, n)
		}},
		{"list", func(t *testing.T, n int) (string, string, string) {
			buyer := fmt.Sprintf("li%d", n)
			return http.MethodPost, "/v1/orders/" + buy(t, resale, buyer, 2) + "/resale", fmt.Sprintf(`{"buyer":%q,"quantity":1}`, buyer)
		}},
		{"withdraw", func(t *testing.T, n int) (string, string, string) {
			buyer := fmt.Sprintf("wd%d", n)
			order := buy(t, resale, buyer, 2)
			r := b.Do(t, http.MethodPost, "/v1/orders/"+order+"/resale", map[string]string{"Idempotency-Key": "prep-list-" + buyer},
				fmt.Sprintf(`{"buyer":%q,"quantity":1}`, buyer))
			if r.Status != http.StatusCreated {
				t.Fatalf("prep listing = %d %s", r.Status, r.Body)
			}
			var x struct {
				ListingID string `json:"listing_id"`
			}
			_ = json.Unmarshal(r.Body, &x)
			// The listed unit reaches the gate before it can be withdrawn.
			systest.WaitFor(t, 10*time.Second, "the listed unit at the gate", func() bool {
				p, err := b.Ledger.PendingRestores(context.Background(), 0, 10)
				return err == nil && len(p) == 0
			})
			return http.MethodPost, "/v1/listings/" + x.ListingID + "/withdraw", fmt.Sprintf(`{"buyer":%q}`, buyer)
		}},
		{"cart", func(t *testing.T, n int) (string, string, string) {
			return http.MethodPost, "/v1/programs/" + program + "/carts",
				fmt.Sprintf(`{"buyer":"cr%d","lines":[{"ticket":%q,"quantity":1},{"ticket":"other","quantity":1}]}`, n, sku.Ticket)
		}},
		{"comp", func(t *testing.T, n int) (string, string, string) {
			return http.MethodPost, systest.AdminPath(sku) + "/orders", fmt.Sprintf(`{"buyer":"cm%d","quantity":1,"channel":"comp"}`, n)
		}},
		{"put sku", func(t *testing.T, n int) (string, string, string) {
			return http.MethodPut, systest.AdminPath(sku), fmt.Sprintf(`{"total":%d,"shards":2,"max_per_order":4}`, 400+10*n)
		}},
		{"put program", func(t *testing.T, n int) (string, string, string) {
			return http.MethodPut, "/v1/admin/programs/" + program, fmt.Sprintf(`{"per_buyer":0,"hold_budget":%d}`, 20+n)
		}},
	}
	faults := []struct {
		name      string
		on, clear func()
	}{
		{"ledger link cut", proxy.Cut, proxy.Restore},
		{"redis down", func() {
			for _, n := range c.Nodes {
				n.Kill()
			}
			systest.TripBreakers(t, a, c.Masters)
		}, func() {
			ctx := context.Background()
			for _, n := range c.Nodes {
				if err := n.Restart(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.WaitHealthy(ctx, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		}},
	}
	counts := map[string]int{}
	for fi, f := range faults {
		type sent struct {
			route, method, path, body, key string
			first                          systest.Reply
		}
		var done []sent
		resale = resales[fi]
		// Everything each route acts on is made first, through the
		// healthy replica, with nothing faulty yet.
		for ri, r := range routes {
			n := fi*100 + ri
			method, path, body := r.prep(t, n)
			done = append(done, sent{route: r.name, method: method, path: path, body: body, key: fmt.Sprintf("sweep-%d", n)})
		}
		f.on()
		for i := range done {
			s := &done[i]
			before := worldOf(t, b, sku.Program)
			got := a.Do(t, s.method, s.path, map[string]string{"Idempotency-Key": s.key}, s.body)
			kind := fmt.Sprintf("%s %d", f.name, got.Status/100*100)
			switch {
			case got.Status >= 500:
				var p struct {
					Outcome string `json:"outcome"`
				}
				_ = json.Unmarshal(got.Body, &p)
				kind += " " + p.Outcome
				switch p.Outcome {
				case "unchanged":
					if after := worldOf(t, b, sku.Program); !reflect.DeepEqual(before, after) {
						t.Errorf("%s under %s: %d says unchanged, but the ledger moved: %s", s.route, f.name, got.Status, got.Body)
					}
				case "unknown":
				default:
					t.Errorf("%s under %s: %d with no outcome: %s", s.route, f.name, got.Status, got.Body)
				}
			case got.Status >= 400:
				if after := worldOf(t, b, sku.Program); !reflect.DeepEqual(before, after) {
					t.Errorf("%s under %s: %d changed the ledger: %s", s.route, f.name, got.Status, got.Body)
				}
			}
			counts[kind]++
			s.first = got
		}
		f.clear()
		// The same request, same key, on the other replica: it tells what
		// happened, and a third send replays it (one movement).
		for _, s := range done {
			var again systest.Reply
			systest.WaitFor(t, 20*time.Second, s.route+" answered after "+f.name, func() bool {
				again = b.Do(t, s.method, s.path, map[string]string{"Idempotency-Key": s.key}, s.body)
				return again.Status < 500
			})
			if s.first.Status < 300 && again.Status != s.first.Status {
				t.Errorf("%s after %s: first %d %s, then %d %s: a 2xx must stand", s.route, f.name, s.first.Status, s.first.Body, again.Status, again.Body)
			}
			before := worldOf(t, b, sku.Program)
			third := b.Do(t, s.method, s.path, map[string]string{"Idempotency-Key": s.key}, s.body)
			if third.Status != again.Status {
				t.Errorf("%s after %s: retried %d then %d", s.route, f.name, again.Status, third.Status)
			}
			if after := worldOf(t, b, sku.Program); !reflect.DeepEqual(before, after) && s.route != "put sku" && s.route != "put program" {
				t.Errorf("%s after %s: a third send of the same request moved the ledger (%d %s)", s.route, f.name, third.Status, third.Body)
			}
		}
	}
	t.Logf("answers under faults: %v", counts)
	// Redis came back empty: a SKU's gate is rebuilt from the ledger by
	// its next purchase; then Redis must agree with the ledger.
	for i, s := range append([]stock.SKU{sku, other}, resales...) {
		systest.WaitFor(t, 20*time.Second, "a purchase of "+s.String()+" after the faults", func() bool {
			return b.Buy(t, s, fmt.Sprintf("after-%d", i), "zed", 1).Status == http.StatusCreated
		})
		systest.WaitSettled(t, b, s)
	}
}
