package clienttest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/gateway"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const token = "client-test-admin-token"

// startGateway starts a real gateway (Redis Cluster, SQLite ledger) and
// returns its URL.
func startGateway(t *testing.T) string {
	t.Helper()
	c := testenv.SharedCluster(t)
	a, err := app.Open(context.Background(), app.Options{
		Redis:  cluster.Options{Addrs: c.Addrs()},
		Ledger: ledger.Options{Driver: ledger.SQLite, DSN: testenv.SQLitePath(t)},
		HTTP:   gateway.Options{AdminToken: token},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	a.Start(app.Loops{Sweep: true, Pacer: true})
	a.Server.SetReady(true)
	hs := httptest.NewServer(a.Server.Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}

func newClient(t *testing.T, base string, o client.Options) *client.Client {
	t.Helper()
	o.BaseURL = base
	c, err := client.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ptr[T any](v T) *T { return &v }

// Every public and admin call against a real gateway, with the problems
// matched as errors.
func TestEveryCall(t *testing.T) {
	ctx := context.Background()
	base := startGateway(t)
	c := newClient(t, base, client.Options{AdminToken: token})
	sku := client.SKU{Program: testenv.ID(t, "p"), Ticket: "ga"}
	if _, err := newClient(t, base, client.Options{}).PutSKU(ctx, sku, client.SKUConfig{Total: ptr[int64](5)}); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("PutSKU without the token = %v, want ErrUnauthorized", err)
	}
	st, err := c.PutSKU(ctx, sku, client.SKUConfig{Total: ptr[int64](5), Shards: ptr(2), MaxPerOrder: ptr[int64](2)})
	if err != nil || st.Total != 5 || st.Shards != 2 {
		t.Fatalf("PutSKU = %+v, %v", st, err)
	}
	if err := c.PutProgram(ctx, sku.Program, 4); err != nil {
		t.Fatalf("PutProgram: %v", err)
	}
	o, err := c.Purchase(ctx, sku, "k1", "ann", 2)
	if err != nil || o.Quantity != 2 || o.OrderID == "" || o.Replayed {
		t.Fatalf("Purchase = %+v, %v", o, err)
	}
	again, err := c.Purchase(ctx, sku, "k1", "ann", 2)
	if err != nil || again.OrderID != o.OrderID || !again.Replayed {
		t.Errorf("the same purchase again = %+v, %v; want the stored answer, replayed", again, err)
	}
	if _, err := c.Purchase(ctx, sku, "k1", "ann", 1); !errors.Is(err, client.ErrKeyReused) {
		t.Errorf("a reused key = %v, want ErrKeyReused", err)
	}
	if _, err := c.Purchase(ctx, sku, "k2", "bob", 3); !errors.Is(err, client.ErrOverMax) {
		t.Errorf("3 over a maximum of 2 = %v, want ErrOverMax", err)
	}
	if got, err := c.GetOrder(ctx, o.OrderID); err != nil || got.OrderID != o.OrderID {
		t.Errorf("GetOrder = %+v, %v", got, err)
	}
	if _, err := c.GetOrder(ctx, "no-such-order"); !errors.Is(err, client.ErrUnknownOrder) {
		t.Errorf("GetOrder of nothing = %v, want ErrUnknownOrder", err)
	}
	h, err := c.Hold(ctx, sku, "h1", "bob", 1, time.Minute)
	if err != nil || h.State != "held" {
		t.Fatalf("Hold = %+v, %v", h, err)
	}
	if _, err := c.Confirm(ctx, h.HoldID, "c1", "eve"); !errors.Is(err, client.ErrNotOwner) {
		t.Errorf("Confirm by another buyer = %v, want ErrNotOwner", err)
	}
	co, err := c.Confirm(ctx, h.HoldID, "c1", "bob")
	if err != nil || co.Quantity != 1 {
		t.Fatalf("Confirm = %+v, %v", co, err)
	}
	if got, err := c.GetHold(ctx, h.HoldID); err != nil || got.State != "confirmed" {
		t.Errorf("GetHold = %+v, %v; want confirmed", got, err)
	}
	h2, err := c.Hold(ctx, sku, "h2", "cat", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Purchase(ctx, sku, "k3", "dan", 1); !errors.Is(err, client.ErrSoldOut) {
		t.Errorf("purchase of the last, held units = %v, want ErrSoldOut", err)
	} else {
		var p *client.Problem
		if !errors.As(err, &p) || p.Status != http.StatusConflict || p.Code() != "sold-out" {
			t.Errorf("sold-out problem = %+v", p)
		}
	}
	if got, err := c.Extend(ctx, h2.HoldID, "e1", "cat", 20*time.Minute); err != nil || !got.ExpiresAt.After(h2.ExpiresAt) {
		t.Errorf("Extend = %+v, %v; want it later than %v", got, err, h2.ExpiresAt)
	}
	if _, err := c.Extend(ctx, h2.HoldID, "e2", "cat", 48*time.Hour); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Extend by two days = %v, want ErrInvalid", err)
	}
	if got, err := c.Cancel(ctx, h2.HoldID, "x1", "cat"); err != nil || got.State != "cancelled" {
		t.Errorf("Cancel = %+v, %v", got, err)
	}
	if _, err := c.Refund(ctx, o.OrderID, "r1", "ann"); err != nil {
		t.Errorf("Refund: %v", err)
	}
	if s, err := c.Stock(ctx, sku); err != nil || s.Program != sku.Program {
		t.Errorf("Stock = %+v, %v", s, err)
	}
	if r, err := c.Reconcile(ctx, sku); err != nil || r.Shards != 2 {
		t.Errorf("Reconcile = %+v, %v", r, err)
	}
	if got, err := c.SKUState(ctx, sku); err != nil || got.Sold != 1 || got.Held != 0 {
		t.Errorf("SKUState = %+v, %v; want 1 sold (the confirm), nothing held", got, err)
	}
	if r, err := c.Report(ctx, sku.Program); err != nil || !r.Balanced || len(r.SKUs) != 1 || r.SKUs[0].Sold != 1 || r.SKUs[0].ConfirmedUnits != 1 ||
		r.SKUs[0].RefundedUnits != 2 || r.SKUs[0].CancelledUnits != 2 {
		t.Errorf("Report = %+v, %v; want 1 confirmed, 2 refunded, 2 cancelled", r, err)
	}
	if got, err := c.EndSale(ctx, sku); err != nil || !got.Ended {
		t.Errorf("EndSale = %+v, %v", got, err)
	}
	if _, err := c.Purchase(ctx, sku, "k4", "fay", 1); !errors.Is(err, client.ErrSaleEnded) {
		t.Errorf("purchase after the end = %v, want ErrSaleEnded", err)
	}

	// Seats.
	seated := client.SKU{Program: sku.Program, Ticket: "stalls"}
	if _, err := c.PutSKU(ctx, seated, client.SKUConfig{Total: ptr[int64](0), Shards: ptr(1), MaxPerOrder: ptr[int64](4)}); err != nil {
		t.Fatal(err)
	}
	var seats []client.Seat
	for i := range 6 {
		seats = append(seats, client.Seat{ID: fmt.Sprintf("A-%02d", i+1), Section: "A", Row: "A", Number: i + 1})
	}
	if n, err := c.PutSeats(ctx, seated, seats); err != nil || n != 6 {
		t.Fatalf("PutSeats = %d, %v", n, err)
	}
	sh, err := c.HoldSeats(ctx, seated, "s1", "gus", []string{"A-01", "A-02"}, 0)
	if err != nil || len(sh.Seats) != 2 {
		t.Fatalf("HoldSeats = %+v, %v", sh, err)
	}
	if _, err := c.HoldSeats(ctx, seated, "s2", "hal", []string{"A-02", "A-03"}, 0); !errors.Is(err, client.ErrSeatsTaken) {
		t.Errorf("taken seats = %v, want ErrSeatsTaken", err)
	} else if !strings.Contains(err.Error(), "A-02") {
		t.Errorf("seats-taken problem %q does not name A-02", err)
	}
	if best, err := c.HoldBestSeats(ctx, seated, "s3", "ivy", "A", 3, 0); err != nil || len(best.Seats) != 3 {
		t.Errorf("HoldBestSeats = %+v, %v", best, err)
	}
	// A cart's seat line names its seats; a taken one is named back.
	if _, err := c.HoldCart(ctx, seated.Program, "sc1", "jan", []client.CartLine{{Ticket: "stalls", Seats: []string{"A-02", "A-06"}}}, 0); !errors.Is(err, client.ErrSeatsTaken) {
		t.Errorf("seat cart over a taken seat = %v, want ErrSeatsTaken", err)
	} else if p := (*client.Problem)(nil); !errors.As(err, &p) || fmt.Sprint(p.Seats) != "[A-02]" || len(p.Lines) != 1 {
		t.Errorf("seats-taken problem %+v, want seat A-02 and line stalls", p)
	}
	if sc, err := c.PurchaseCart(ctx, seated.Program, "sc2", "jan", []client.CartLine{{Ticket: "stalls", Seats: []string{"A-06"}}}); err != nil ||
		fmt.Sprint(sc.Orders[0].Seats) != "[A-06]" {
		t.Errorf("seat cart = %+v, %v; want its order with seat A-06", sc, err)
	}
	if raw, err := c.Seats(ctx, seated, "A"); err != nil || !strings.Contains(string(raw), "A-06") {
		t.Errorf("Seats = %s, %v", raw, err)
	}
	if _, err := c.CheckSeats(ctx, seated); err != nil {
		t.Errorf("CheckSeats: %v", err)
	}

	// Carts.
	program := testenv.ID(t, "c")
	for _, ticket := range []string{"adult", "child"} {
		if _, err := c.PutSKU(ctx, client.SKU{Program: program, Ticket: ticket}, client.SKUConfig{Total: ptr[int64](3), Shards: ptr(1), MaxPerOrder: ptr[int64](4)}); err != nil {
			t.Fatal(err)
		}
	}
	cart, err := c.PurchaseCart(ctx, program, "cart1", "jo", []client.CartLine{{Ticket: "child", Quantity: 1}, {Ticket: "adult", Quantity: 2}})
	if err != nil || len(cart.Orders) != 2 || cart.Orders[0].Ticket != "adult" || cart.Replayed {
		t.Fatalf("PurchaseCart = %+v, %v", cart, err)
	}
	if again, err := c.PurchaseCart(ctx, program, "cart1", "jo", []client.CartLine{{Ticket: "adult", Quantity: 2}, {Ticket: "child", Quantity: 1}}); err != nil ||
		again.CartID != cart.CartID || !again.Replayed {
		t.Errorf("the same cart again = %+v, %v; want the replay", again, err)
	}
	_, err = c.PurchaseCart(ctx, program, "cart2", "kim", []client.CartLine{{Ticket: "adult", Quantity: 2}, {Ticket: "child", Quantity: 1}})
	var p *client.Problem
	if !errors.Is(err, client.ErrSoldOut) || !errors.As(err, &p) || len(p.Lines) != 1 || p.Lines[0].Ticket != "adult" {
		t.Errorf("a cart with adult sold out = %v (%+v), want sold-out naming adult", err, p)
	}
	if got, err := c.GetCart(ctx, cart.CartID); err != nil || got.CartID != cart.CartID || len(got.Orders) != 2 {
		t.Errorf("GetCart = %+v, %v", got, err)
	}
	if _, err := c.GetCart(ctx, "no-such-cart"); !errors.Is(err, client.ErrUnknownCart) {
		t.Errorf("GetCart of nothing = %v, want ErrUnknownCart", err)
	}
	if got, err := c.RefundCart(ctx, cart.CartID, "cart1-refund", "jo"); err != nil || len(got.Orders) != 2 || got.Orders[0].RefundedAt == nil {
		t.Errorf("RefundCart = %+v, %v; want both orders refunded", got, err)
	}

	// Held carts: held whole, a line cannot be confirmed alone, confirmed
	// whole; another cancelled whole.
	held, err := c.HoldCart(ctx, program, "hcart1", "lou", []client.CartLine{{Ticket: "adult", Quantity: 1}, {Ticket: "child", Quantity: 1}}, time.Minute)
	if err != nil || len(held.Holds) != 2 || held.ExpiresAt == nil || len(held.Orders) != 0 {
		t.Fatalf("HoldCart = %+v, %v", held, err)
	}
	if _, err := c.Confirm(ctx, held.Holds[0].HoldID, "hline", "lou"); !errors.Is(err, client.ErrInCart) {
		t.Errorf("confirm of one line = %v, want ErrInCart", err)
	}
	if got, err := c.ConfirmCart(ctx, held.CartID, "hcart1-confirm", "lou"); err != nil || len(got.Orders) != 2 {
		t.Errorf("ConfirmCart = %+v, %v", got, err)
	}
	other, err := c.HoldCart(ctx, program, "hcart2", "max", []client.CartLine{{Ticket: "child", Quantity: 1}}, 0)
	if err != nil {
		t.Fatalf("HoldCart = %+v, %v", other, err)
	}
	if got, err := c.CancelCart(ctx, other.CartID, "hcart2-cancel", "max"); err != nil || got.Holds[0].State != "cancelled" {
		t.Errorf("CancelCart = %+v, %v", got, err)
	}
	if _, err := c.ConfirmCart(ctx, other.CartID, "hcart2-confirm", "max"); !errors.Is(err, client.ErrHoldCancelled) {
		t.Errorf("ConfirmCart of a cancelled cart = %v, want ErrHoldCancelled", err)
	}

	// Pools and access codes.
	pooled := client.SKU{Program: program, Ticket: "pooled"}
	if _, err := c.PutSKU(ctx, pooled, client.SKUConfig{Total: ptr[int64](10), Shards: ptr(1), MaxPerOrder: ptr[int64](4)}); err != nil {
		t.Fatal(err)
	}
	if p, err := c.PutPool(ctx, pooled, "fans", client.PoolConfig{Allotment: 4, Access: "code"}); err != nil || p.Allotment != 4 {
		t.Fatalf("PutPool = %+v, %v", p, err)
	}
	added, codes, err := c.AddCodes(ctx, pooled, "fans", []client.Code{{Code: "FANS-ONE", MaxUses: 1}}, 2, 1)
	if err != nil || added != 3 || len(codes) != 2 {
		t.Fatalf("AddCodes = %d, %v, %v", added, codes, err)
	}
	if _, err := c.PurchaseIn(ctx, pooled, client.Access{Pool: "fans", AccessCode: "NOT-A-CODE"}, "pc0", "nia", 1); !errors.Is(err, client.ErrCodeInvalid) {
		t.Errorf("a wrong code = %v, want ErrCodeInvalid", err)
	}
	if o, err := c.PurchaseIn(ctx, pooled, client.Access{Pool: "fans", AccessCode: codes[0]}, "pc1", "nia", 1); err != nil || o.Quantity != 1 {
		t.Errorf("PurchaseIn with a code = %+v, %v", o, err)
	}
	if _, err := c.HoldIn(ctx, pooled, client.Access{Pool: "fans", AccessCode: codes[0]}, "pc2", "ola", 1, 0); !errors.Is(err, client.ErrCodeUsedUp) {
		t.Errorf("a used code = %v, want ErrCodeUsedUp", err)
	}
	if ps, err := c.Pools(ctx, pooled); err != nil || len(ps) != 2 || ps[1].Sold != 1 {
		t.Errorf("Pools = %+v, %v", ps, err)
	}
	if p, err := c.ClosePool(ctx, pooled, "fans"); err != nil || p.ClosedAt == nil || p.Allotment != 1 {
		t.Errorf("ClosePool = %+v, %v; want closed with its 1 sold", p, err)
	}
}

// A 503 (or 429) is sent again with the same Idempotency-Key after its
// Retry-After, and the purchase is made once; with one attempt the problem
// comes back as ErrUnavailable with its Retry-After.
func TestRetriesWithTheSameKey(t *testing.T) {
	ctx := context.Background()
	target, err := url.Parse(startGateway(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	var keys []string
	refuse := 0
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/purchases") {
			mu.Lock()
			keys = append(keys, r.Header.Get("Idempotency-Key"))
			n := refuse
			if refuse > 0 {
				refuse--
			}
			mu.Unlock()
			if n > 0 {
				// What a gateway answers while Redis and the ledger are both out.
				w.Header().Set("Retry-After", "1")
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprint(w, `{"type":"https://stockgate.dev/problems/unavailable","title":"Service Unavailable","status":503}`)
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()
	c := newClient(t, front.URL, client.Options{AdminToken: token})
	sku := client.SKU{Program: testenv.ID(t, "p"), Ticket: "ga"}
	if _, err := c.PutSKU(ctx, sku, client.SKUConfig{Total: ptr[int64](10), Shards: ptr(1), MaxPerOrder: ptr[int64](2)}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	refuse = 2
	mu.Unlock()
	o, err := c.Purchase(ctx, sku, "retry-1", "ann", 1)
	if err != nil || o.Quantity != 1 {
		t.Fatalf("purchase through two 503s = %+v, %v", o, err)
	}
	mu.Lock()
	sent := append([]string(nil), keys...)
	mu.Unlock()
	if len(sent) != 3 || sent[0] != "retry-1" || sent[1] != "retry-1" || sent[2] != "retry-1" {
		t.Errorf("keys sent: %v, want the same key three times", sent)
	}
	if st, err := c.SKUState(ctx, sku); err != nil || st.Sold != 1 {
		t.Errorf("sold %d (%v) after a retried purchase, want 1", st.Sold, err)
	}

	once := newClient(t, front.URL, client.Options{Attempts: 1})
	mu.Lock()
	refuse = 1
	mu.Unlock()
	_, err = once.Purchase(ctx, sku, "retry-2", "bob", 1)
	var p *client.Problem
	if !errors.Is(err, client.ErrUnavailable) || !errors.As(err, &p) || p.RetryAfter != time.Second {
		t.Errorf("one attempt at a 503 = %v (%+v), want ErrUnavailable with Retry-After 1s", err, p)
	}
}

// ConfirmPart keeps some of a hold's units and gives the rest back.
func TestConfirmPartCall(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, startGateway(t), client.Options{AdminToken: token})
	sku := client.SKU{Program: testenv.ID(t, "p"), Ticket: "ga"}
	if _, err := c.PutSKU(ctx, sku, client.SKUConfig{Total: ptr[int64](5), Shards: ptr(1), MaxPerOrder: ptr[int64](4)}); err != nil {
		t.Fatal(err)
	}
	h, err := c.Hold(ctx, sku, "h1", "ann", 3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ConfirmPart(ctx, h.HoldID, "c0", "ann", 4); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("ConfirmPart of 4 of 3 = %v, want ErrInvalid", err)
	}
	o, err := c.ConfirmPart(ctx, h.HoldID, "c1", "ann", 2)
	if err != nil || o.Quantity != 2 {
		t.Fatalf("ConfirmPart = %+v, %v", o, err)
	}
	if st, err := c.SKUState(ctx, sku); err != nil || st.Sold != 2 || st.Held != 0 || st.Remaining != 3 {
		t.Errorf("after ConfirmPart: %+v, %v; want 2 sold, 3 left", st, err)
	}
}

// Transfer moves an order's tickets to another buyer.
func TestTransferCall(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, startGateway(t), client.Options{AdminToken: token})
	sku := client.SKU{Program: testenv.ID(t, "p"), Ticket: "ga"}
	if _, err := c.PutSKU(ctx, sku, client.SKUConfig{Total: ptr[int64](5), Shards: ptr(1), MaxPerOrder: ptr[int64](4)}); err != nil {
		t.Fatal(err)
	}
	o, err := c.Purchase(ctx, sku, "p1", "ann", 3)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Transfer(ctx, o.OrderID, "t1", "ann", "bob", 1)
	if err != nil || got.Buyer != "bob" || got.Quantity != 1 || got.OrderID == o.OrderID {
		t.Fatalf("Transfer = %+v, %v", got, err)
	}
	if _, err := c.Transfer(ctx, o.OrderID, "t2", "eve", "bob", 0); !errors.Is(err, client.ErrNotOwner) {
		t.Errorf("Transfer by another buyer = %v, want ErrNotOwner", err)
	}
}

// Hold budgets through the client: a program's settings, and a hold over
// a fingerprint's budget matched as ErrHoldBudget.
func TestHoldBudgetCalls(t *testing.T) {
	ctx := context.Background()
	base := startGateway(t)
	c := newClient(t, base, client.Options{AdminToken: token})
	sku := client.SKU{Program: testenv.ID(t, "p"), Ticket: "ga"}
	if _, err := c.PutSKU(ctx, sku, client.SKUConfig{Total: ptr[int64](10), MaxPerOrder: ptr[int64](4)}); err != nil {
		t.Fatal(err)
	}
	if err := c.PutProgramSettings(ctx, client.ProgramSettings{Program: sku.Program, HoldBudget: 3, DeviceHoldBudget: 2}); err != nil {
		t.Fatalf("PutProgramSettings: %v", err)
	}
	phone := c.ForDevice("phone-1")
	if _, err := phone.Hold(ctx, sku, "h1", "ann", 2, time.Minute); err != nil {
		t.Fatalf("Hold within the budgets: %v", err)
	}
	if _, err := phone.Hold(ctx, sku, "h2", "bob", 1, time.Minute); !errors.Is(err, client.ErrHoldBudget) {
		t.Errorf("a hold over the fingerprint's budget = %v, want ErrHoldBudget", err)
	}
	if _, err := c.Hold(ctx, sku, "h3", "bob", 1, time.Minute); err != nil {
		t.Errorf("the same hold without the fingerprint = %v, want held", err)
	}
	if err := c.PutProgramSettings(ctx, client.ProgramSettings{Program: sku.Program, HoldBudget: -1}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("a negative budget = %v, want ErrInvalid", err)
	}
}

// Resale through the client: list, read, refuse a refund of listed
// tickets, withdraw.
func TestResaleCalls(t *testing.T) {
	ctx := context.Background()
	base := startGateway(t)
	c := newClient(t, base, client.Options{AdminToken: token})
	sku := client.SKU{Program: testenv.ID(t, "p"), Ticket: "ga"}
	if _, err := c.PutSKU(ctx, sku, client.SKUConfig{Total: ptr[int64](10), MaxPerOrder: ptr[int64](4)}); err != nil {
		t.Fatal(err)
	}
	o, err := c.Purchase(ctx, sku, "k1", "ann", 3)
	if err != nil {
		t.Fatal(err)
	}
	x, err := c.ListForResale(ctx, o.OrderID, "l1", "ann", 2)
	if err != nil || x.State != "listed" || x.Quantity != 2 {
		t.Fatalf("ListForResale = %+v, %v", x, err)
	}
	if got, err := c.GetListing(ctx, x.ListingID); err != nil || got.ListingID != x.ListingID {
		t.Errorf("GetListing = %+v, %v", got, err)
	}
	if _, err := c.Refund(ctx, o.OrderID, "r1", "ann"); !errors.Is(err, client.ErrOrderListed) {
		t.Errorf("a refund of listed tickets = %v, want ErrOrderListed", err)
	}
	if comp, err := c.OrganizerOrder(ctx, sku, "c1", "press", 1, "comp"); err != nil || comp.Quantity != 1 {
		t.Errorf("OrganizerOrder = %+v, %v", comp, err)
	}
	if _, err := c.OrganizerOrder(ctx, sku, "c2", "press", 1, "gift"); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("OrganizerOrder of another channel = %v, want ErrInvalid", err)
	}
	// The comp order, made while ann's tickets were listed, took one of
	// them (resale "first"): the withdrawal settles it, however new.
	if w, err := c.WithdrawListing(ctx, x.ListingID, "w1", "ann"); err != nil || w.State != "withdrawn" || w.Sold != 1 || w.Withdrawn != 1 {
		t.Errorf("WithdrawListing = %+v, %v", w, err)
	}
	if _, err := c.WithdrawListing(ctx, x.ListingID, "w2", "ann"); !errors.Is(err, client.ErrListingEnded) {
		t.Errorf("a second withdrawal = %v, want ErrListingEnded", err)
	}
	if _, err := c.GetListing(ctx, "nope"); !errors.Is(err, client.ErrUnknownListing) {
		t.Errorf("GetListing of nothing = %v, want ErrUnknownListing", err)
	}
}
