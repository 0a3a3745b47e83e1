package relay_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/client"
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

// Which of the events a platform was told of the ledger lacks: the ids it
// has are not missing, one it never wrote is (once, however often sent),
// and a page too long or an id that is not one is refused, changing
// nothing.
func TestMissingEventsAPI(t *testing.T) {
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 3, 1, 4)
	e.MustBuy(t, sku, "k1", "ann", 1)
	e.MustBuy(t, sku, "k2", "bob", 1)
	r := e.Do(t, http.MethodGet, fmt.Sprintf("/v1/admin/events?program=%s", sku.Program), nil, "")
	var evs eventsReply
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &evs) != nil || len(evs.Events) != 2 {
		t.Fatalf("GET events = %d %s", r.Status, r.Body)
	}
	gone := strings.Repeat("0", 32)
	ask := func(body string) (int, []string, int) {
		r := e.Do(t, http.MethodPost, "/v1/admin/events/missing", nil, body)
		var got struct {
			Missing []string `json:"missing"`
			Checked int      `json:"checked"`
		}
		if r.Status == http.StatusOK && (json.Unmarshal(r.Body, &got) != nil || got.Missing == nil) {
			t.Fatalf("POST events/missing %s = %s, not a list", body, r.Body)
		}
		return r.Status, got.Missing, got.Checked
	}
	body := fmt.Sprintf(`{"ids":[%q,%q,%q,%q]}`, gone, evs.Events[0].ID, gone, evs.Events[1].ID)
	if st, missing, checked := ask(body); st != http.StatusOK || strings.Join(missing, ",") != gone || checked != 4 {
		t.Errorf("missing of %s = %d %v (checked %d), want only %s", body, st, missing, checked, gone)
	}
	if st, missing, _ := ask(`{"ids":[]}`); st != http.StatusOK || len(missing) != 0 {
		t.Errorf("missing of none = %d %v", st, missing)
	}
	// The Go client's call says the same.
	cl, err := client.New(client.Options{BaseURL: e.URL})
	if err != nil {
		t.Fatal(err)
	}
	if missing, err := cl.MissingEvents(t.Context(), []string{evs.Events[1].ID, gone, gone}); err != nil || strings.Join(missing, ",") != gone {
		t.Errorf("client MissingEvents = %v, %v; want only %s", missing, err, gone)
	}
	if missing, err := cl.MissingEvents(t.Context(), nil); err != nil || missing == nil || len(missing) != 0 {
		t.Errorf("client MissingEvents of none = %#v, %v; want an empty list", missing, err)
	}
	if _, err := cl.MissingEvents(t.Context(), []string{"a b"}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("client MissingEvents of a bad id = %v, want client.ErrInvalid", err)
	}
	many := make([]string, 1001)
	for i := range many {
		many[i] = fmt.Sprintf("%032x", i)
	}
	page, _ := json.Marshal(map[string][]string{"ids": many})
	if st, _, _ := ask(string(page)); st != http.StatusUnprocessableEntity {
		t.Errorf("missing of 1,001 ids = %d, want 422", st)
	}
	for body, want := range map[string]int{
		`{"ids":["a b"]}`:          http.StatusUnprocessableEntity,
		`{"ids":"x"}`:              http.StatusUnprocessableEntity,
		`{"ids":[1]}`:              http.StatusUnprocessableEntity,
		`{}`:                       http.StatusUnprocessableEntity, // not "nothing missing"
		`{"ids":null}`:             http.StatusUnprocessableEntity,
		`{"ids":[],"program":"p"}`: http.StatusBadRequest,
		`[`:                        http.StatusBadRequest,
	} {
		if st, _, _ := ask(body); st != want {
			t.Errorf("missing of %s = %d, want %d", body, st, want)
		}
	}
}
