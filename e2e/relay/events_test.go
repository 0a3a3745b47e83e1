package relay_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

type eventsReply struct {
	Events []struct {
		Seq      int64  `json:"seq"`
		ID       string `json:"id"`
		Type     string `json:"type"`
		Ticket   string `json:"ticket"`
		Pool     string `json:"pool"`
		Subject  string `json:"subject"`
		Quantity int64  `json:"quantity"`
		ToPool   string `json:"to_pool"`
	} `json:"events"`
	Next int64 `json:"next"`
}

// The outbox through the API: a sale's changes in order, a pool's named
// by ticket and pool, pages read on from next, and bad queries refused.
func TestEventsAPI(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 3, 1, 4)
	if r := e.Do(t, http.MethodPut, systest.AdminPath(sku)+"/pools/fans", nil, `{"allotment":1}`); r.Status != http.StatusOK {
		t.Fatalf("PUT pool = %d %s", r.Status, r.Body)
	}
	order := systest.OrderID(e.MustBuy(t, sku, "k1", "ann", 2))
	if r := e.Do(t, http.MethodPost, systest.SKUPath(sku)+"/purchases?pool=fans", map[string]string{"Idempotency-Key": "k2"}, `{"buyer":"bob","quantity":1}`); r.Status != http.StatusCreated {
		t.Fatalf("pool purchase = %d %s", r.Status, r.Body)
	}
	if r := e.Act(t, "/v1/orders/"+order+"/refund", "k3", "ann"); r.Status != http.StatusOK {
		t.Fatalf("refund = %d %s", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodPost, systest.AdminPath(sku)+"/end", nil, ""); r.Status != http.StatusOK {
		t.Fatalf("end = %d %s", r.Status, r.Body)
	}
	var all []string
	var after int64
	for page := 0; ; page++ {
		r := e.Do(t, http.MethodGet, fmt.Sprintf("/v1/admin/events?program=%s&after=%d&limit=2", sku.Program, after), nil, "")
		var got eventsReply
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &got) != nil {
			t.Fatalf("GET events = %d %s", r.Status, r.Body)
		}
		if len(got.Events) == 0 {
			if got.Next != after {
				t.Errorf("an empty page's next = %d, want %d", got.Next, after)
			}
			break
		}
		for _, ev := range got.Events {
			if ev.Seq <= after || ev.ID == "" || ev.Ticket != sku.Ticket.String() {
				t.Errorf("event %+v after %d", ev, after)
			}
			after = ev.Seq
			all = append(all, fmt.Sprintf("%s/%s:%d", ev.Type, ev.Pool, ev.Quantity))
		}
		if got.Next != after {
			t.Errorf("next = %d, want the last seq %d", got.Next, after)
		}
	}
	// Each stock sold out by the take that emptied it (its event after the
	// order's); ending the ticket ends its pool.
	want := "order.created/:2 sale.sold_out/:0 order.created/fans:1 sale.sold_out/fans:0 order.refunded/:2 sale.ended/:0 sale.ended/fans:0"
	if got := strings.Join(all, " "); got != want {
		t.Errorf("events:\n %s\nwant\n %s", got, want)
	}
	for _, q := range []string{"after=-1", "after=x", "limit=0", "limit=1001", "limit=2.5"} {
		if r := e.Do(t, http.MethodGet, "/v1/admin/events?"+q, nil, ""); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("events?%s = %d %s, want 422", q, r.Status, r.Body)
		}
	}
	if r := e.Do(t, http.MethodGet, "/v1/admin/events?program=a%20b", nil, ""); r.Status != http.StatusBadRequest {
		t.Errorf("events of a bad program id = %d %s, want 400", r.Status, r.Body)
	}
}
