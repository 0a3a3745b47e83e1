package requests_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// A committed purchase is refunded (its quota count given back), the buyer
// then buys up to the cap with another key, and the client's late retry of
// the first purchase arrives. The retry is the same request: it gets the
// replay of its 201, though the gate's quota count refuses it as new.
func TestAttackRetryAtCapAfterRefund(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutCapped(t, sku, 2, 2)
		b := e.MustBuy(t, sku, "k1", "ann", 2)
		if f := e.Act(t, "/v1/orders/"+systest.OrderID(b)+"/refund", "f1", "ann"); f.Status != 200 {
			t.Fatalf("refund = %d %s", f.Status, f.Body)
		}
		e.MustBuy(t, sku, "k2", "ann", 2)
		again := e.Buy(t, sku, "k1", "ann", 2)
		if again.Status != 201 || systest.OrderID(again) != systest.OrderID(b) {
			t.Errorf("retry of the refunded purchase k1 = %d %s, want the replay of order %s", again.Status, again.Body, systest.OrderID(b))
		}
		used, _ := e.Redis.HGet(context.Background(), keys.Quota(sku.Program, sku.Ticket, keys.MustID("ann")), "used").Int64()
		if used != 2 {
			t.Errorf("redis quota used = %d, want 2", used)
		}
	})
}

// The same with a cancelled hold and a program cap.
func TestAttackHoldRetryAtProgramCapAfterCancel(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 100, 1, 4)
		if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, `{"per_buyer":1}`); r.Status != 200 {
			t.Fatalf("PUT program = %d %s", r.Status, r.Body)
		}
		r, h := e.Hold(t, sku, "h1", "ann", 1, 0)
		if r.Status != 201 {
			t.Fatalf("hold = %d %s", r.Status, r.Body)
		}
		if c := e.Act(t, "/v1/holds/"+h.HoldID+"/cancel", "c1", "ann"); c.Status != 200 {
			t.Fatalf("cancel = %d %s", c.Status, c.Body)
		}
		e.MustBuy(t, sku, "k2", "ann", 1)
		again, h2 := e.Hold(t, sku, "h1", "ann", 1, 0)
		if again.Status != 201 || h2.HoldID != h.HoldID {
			t.Errorf("retry of the cancelled hold h1 = %d %s, want the replay of hold %s", again.Status, again.Body, h.HoldID)
		}
	})
}

// The buyer owns its cap through key k1; the same key with another body
// gets 422 (idempotency-key-reused), not the 409 limit-reached the quota
// count gives the new fingerprint.
func TestAttackReusedKeyAtCap(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutCapped(t, sku, 1, 2)
		e.MustBuy(t, sku, "k1", "ann", 2)
		if r := e.Buy(t, sku, "k1", "ann", 1); r.Status != 422 {
			t.Errorf("key k1 reused with quantity 1 by a buyer at the cap = %d %s, want 422", r.Status, r.Body)
		}
	})
}

// The retry of a committed purchase is counted again per scope: the SKU's
// scope finds its count ("already"), the program's (a cap lowered since)
// refuses. The retry gets its replay, and the refusal gives back only the
// counts this attempt made: the SKU count the committed order stands on
// stays.
func TestAttackLoweredProgramCapReleasesSKUCount(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		vip := sku
		vip.Ticket = keys.MustID("vip")
		e.PutCapped(t, sku, 1, 4)
		e.PutSKU(t, vip, 100, 1, 4)
		b := e.MustBuy(t, sku, "k1", "ann", 2)
		if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, `{"per_buyer":3}`); r.Status != 200 {
			t.Fatalf("PUT program = %d %s", r.Status, r.Body)
		}
		e.MustBuy(t, vip, "k2", "ann", 1)
		if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String(), nil, `{"per_buyer":2}`); r.Status != 200 {
			t.Fatalf("PUT program = %d %s", r.Status, r.Body)
		}
		again := e.Buy(t, sku, "k1", "ann", 2)
		if again.Status != 201 || systest.OrderID(again) != systest.OrderID(b) {
			t.Errorf("retry of k1 = %d %s, want the replay", again.Status, again.Body)
		}
		ctx := context.Background()
		used, _ := e.Redis.HGet(ctx, keys.Quota(sku.Program, sku.Ticket, keys.MustID("ann")), "used").Int64()
		units, _ := e.Ledger.BuyerUnits(ctx, sku, keys.MustID("ann"))
		if used != units {
			t.Errorf("redis quota used = %d for %s, ledger holds+owns %d", used, sku.Ticket, units)
		}
	})
}

// A purchase committed before the SKU had a per-buyer cap was never
// counted at the gate. Refunded, with the buyer at the new cap through
// another key, its retry still gets its replay (found among the SKU's
// committed keys), not 409 limit-reached.
func TestAttackRetryOfUncountedPurchaseAtCap(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 100, 1, 4)
		b := e.MustBuy(t, sku, "k1", "ann", 2)
		e.PutCapped(t, sku, 1, 2)
		if f := e.Act(t, "/v1/orders/"+systest.OrderID(b)+"/refund", "f1", "ann"); f.Status != 200 {
			t.Fatalf("refund = %d %s", f.Status, f.Body)
		}
		e.MustBuy(t, sku, "k2", "ann", 2)
		again := e.Buy(t, sku, "k1", "ann", 2)
		if again.Status != 201 || systest.OrderID(again) != systest.OrderID(b) {
			t.Errorf("retry of k1 = %d %s, want the replay of order %s", again.Status, again.Body, systest.OrderID(b))
		}
		if r := e.Buy(t, sku, "k1", "ann", 1); r.Status != 422 {
			t.Errorf("k1 reused = %d %s, want 422", r.Status, r.Body)
		}
	})
}

// A reused key under the cap (refused by the ledger, 422) must not take or
// drop the mark its committed request left at the gate: after a refund and
// the buyer at the cap again, the first request's retry is still replayed.
func TestAttackReusedKeyKeepsTheMark(t *testing.T) {
	systest.FullTier(t)
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutCapped(t, sku, 1, 4)
		b := e.MustBuy(t, sku, "k1", "ann", 2)
		if r := e.Buy(t, sku, "k1", "ann", 1); r.Status != 422 {
			t.Fatalf("k1 reused under the cap = %d %s, want 422", r.Status, r.Body)
		}
		if f := e.Act(t, "/v1/orders/"+systest.OrderID(b)+"/refund", "f1", "ann"); f.Status != 200 {
			t.Fatalf("refund = %d %s", f.Status, f.Body)
		}
		e.MustBuy(t, sku, "k2", "ann", 4)
		again := e.Buy(t, sku, "k1", "ann", 2)
		if again.Status != 201 || systest.OrderID(again) != systest.OrderID(b) {
			t.Errorf("retry of k1 = %d %s, want the replay of order %s", again.Status, again.Body, systest.OrderID(b))
		}
		used, _ := e.Redis.HGet(context.Background(), keys.Quota(sku.Program, sku.Ticket, keys.MustID("ann")), "used").Int64()
		if used != 4 {
			t.Errorf("redis quota used = %d, want 4", used)
		}
	})
}

// Stock that comes back from a ticket whose sale has ended (a refund, a
// cancel, an expiry) owes Redis no units, so its restore is skipped, and
// with it the release of the buyer's counts at the gate: the buyer's
// program-wide count stays too high, and the buyer is refused
// limit-reached for the program's other tickets while under the cap.
// Fails on 3098a61.
func TestModelBugEndedTicketKeepsBuyerCount(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	p := keys.MustID(testenv.ID(t, "bug"))
	a := stock.SKU{Program: p, Ticket: keys.MustID("a")}
	b := stock.SKU{Program: p, Ticket: keys.MustID("b")}
	e.PutSKU(t, a, 10, 1, 4)
	e.PutSKU(t, b, 10, 1, 4)
	if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+p.String(), nil, `{"per_buyer":4}`); r.Status != http.StatusOK {
		t.Fatalf("PUT program = %d %s", r.Status, r.Body)
	}
	o := systest.OrderID(e.MustBuy(t, a, "buy-a", "ann", 3))
	if r := e.Do(t, http.MethodPost, systest.AdminPath(a)+"/end", nil, ""); r.Status != http.StatusOK {
		t.Fatalf("end = %d %s", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodPost, "/v1/orders/"+o+"/refund", map[string]string{"Idempotency-Key": "refund-a"}, `{"buyer":"ann"}`); r.Status != http.StatusOK {
		t.Fatalf("refund = %d %s", r.Status, r.Body)
	}
	if units, err := e.Ledger.ProgramUnits(t.Context(), p, keys.MustID("ann")); err != nil || units != 0 {
		t.Fatalf("ann's program units after the refund = %d, %v; want 0", units, err)
	}
	if r := e.Buy(t, b, "buy-b", "ann", 3); r.Status != http.StatusCreated {
		t.Errorf("ann, owning nothing of the program (cap 4), buys 3 of b = %d %s, want 201", r.Status, r.Body)
	}
}
