package holds_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/sale"
)

// batchReplyLost commits every confirm and cancel batch and then says the
// batch failed, as a COMMIT whose reply was lost does: the service decides
// each request alone again, and finds it committed (a replay).
type batchReplyLost struct{ sale.Ledger }

var errBatchReplyLost = errors.New("ledger: batch: commit: reply lost")

func (l batchReplyLost) ConfirmBatch(ctx context.Context, cs []ledger.HoldRequest) ([]ledger.BatchResult, error) {
	if _, err := l.Ledger.ConfirmBatch(ctx, cs); err != nil {
		return nil, err
	}
	return nil, errBatchReplyLost
}

func (l batchReplyLost) CancelBatch(ctx context.Context, cs []ledger.HoldRequest) ([]ledger.HoldResult, error) {
	if _, err := l.Ledger.CancelBatch(ctx, cs); err != nil {
		return nil, err
	}
	return nil, errBatchReplyLost
}

// ConfirmPart commits and then says it failed: the client is told 503 and
// its retry under the same key finds the order (a replay).
func (l batchReplyLost) ConfirmPart(ctx context.Context, id, buyer keys.ID, keep int64, req ledger.Request) (ledger.Order, error) {
	o, err := l.Ledger.ConfirmPart(ctx, id, buyer, keep, req)
	if err == nil {
		return ledger.Order{}, errBatchReplyLost
	}
	return o, err
}

// A confirm, a partial confirm and a cancel whose COMMIT reply was lost
// are answered from their rows (replayed, at once or on the client's
// retry), and still give the hold's units back to the buyer's hold budget
// at once, as API.md promises, not at the hold's expiry: with a budget of
// two units, the buyer's next hold of two is granted after each
// (helper-55: 409 hold-budget-reached until the first hold's expiry).
func TestReplayedEndsGiveTheBudgetBack(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.Start(t, systest.Options{Driver: driver, Tune: func(o *app.Options) {
			o.WrapLedger = func(l sale.Ledger) sale.Ledger { return batchReplyLost{l} }
		}})
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 100, 1, 4)
		putBudgets(t, e, sku.Program.String(), 2, 0)
		end := func(path, key, body string) {
			t.Helper()
			r, _ := e.Retried(t, http.MethodPost, path, key, body)
			if r.Status/100 != 2 || r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("%s, its batch's reply lost = %d %s (replayed %q), want 2xx replayed", path, r.Status, r.Body, r.Header.Get("Idempotent-Replayed"))
			}
		}
		for i, c := range []struct{ what, path, body string }{
			{"confirm", "confirm", `{"buyer":"ann"}`},
			{"partial confirm", "confirm", `{"buyer":"ann","quantity":1}`},
			{"cancel", "cancel", `{"buyer":"ann"}`},
		} {
			r := holdAs(t, e, sku, fmt.Sprintf("ann-%d", i), "ann", "", 2)
			if r.Status != http.StatusCreated {
				t.Fatalf("ann's hold before the %s = %d %s", c.what, r.Status, r.Body)
			}
			if r := holdAs(t, e, sku, fmt.Sprintf("ann-%d-over", i), "ann", "", 1); r.Status != http.StatusConflict || systest.ProblemKind(r) != "hold-budget-reached" {
				t.Fatalf("a hold over ann's budget = %d %s, want 409 hold-budget-reached", r.Status, r.Body)
			}
			end("/v1/holds/"+systest.ReplyID(r)+"/"+c.path, fmt.Sprintf("ann-%d-%s", i, c.path), c.body)
			if r := holdAs(t, e, sku, fmt.Sprintf("ann-%d-after", i), "ann", "", 2); r.Status != http.StatusCreated {
				t.Errorf("a hold after the replayed %s = %d %s, want 201: the budget kept the ended hold", c.what, r.Status, r.Body)
			} else {
				end("/v1/holds/"+systest.ReplyID(r)+"/cancel", fmt.Sprintf("ann-%d-after-cancel", i), `{"buyer":"ann"}`)
			}
		}
	})
}
