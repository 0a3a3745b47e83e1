package systest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/stock"
)

// The requests several capabilities' tests send. Each returns the Reply
// with what the test reads of its body.

// HoldReply is what a test reads of a hold (or seat hold) answer.
type HoldReply struct {
	HoldID    string    `json:"hold_id"`
	State     string    `json:"state"`
	ExpiresAt time.Time `json:"expires_at"`
	OrderID   string    `json:"order_id"`
}

// Hold holds q of sku for buyer for ttl seconds (0: the ticket's default).
func (e *Env) Hold(t *testing.T, sku stock.SKU, key, buyer string, q int64, ttl int) (Reply, HoldReply) {
	body := fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, buyer, q)
	if ttl > 0 {
		body = fmt.Sprintf(`{"buyer":%q,"quantity":%d,"ttl_seconds":%d}`, buyer, q, ttl)
	}
	r := e.Do(t, http.MethodPost, SKUPath(sku)+"/holds", map[string]string{"Idempotency-Key": key}, body)
	var h HoldReply
	_ = json.Unmarshal(r.Body, &h)
	return r, h
}

// HoldState reads hold id's state ("" when the read fails).
func (e *Env) HoldState(t *testing.T, id string) string {
	r := e.Do(t, http.MethodGet, "/v1/holds/"+id, nil, "")
	var h HoldReply
	_ = json.Unmarshal(r.Body, &h)
	return h.State
}

// Act posts a buyer's action (confirm, cancel, refund …) to path.
func (e *Env) Act(t *testing.T, path, key, buyer string) Reply {
	return e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, fmt.Sprintf(`{"buyer":%q}`, buyer))
}

// LoadSeats uploads a seat map of the sections, n seats each in row A
// ("A-01" … for section A), or fails the test.
func (e *Env) LoadSeats(t *testing.T, sku stock.SKU, sections map[string]int) {
	t.Helper()
	var parts []string
	for sec, n := range sections {
		for i := range n {
			parts = append(parts, fmt.Sprintf(`{"id":"%s-%02d","section":%q,"row":"A","number":%d}`, sec, i+1, sec, i+1))
		}
	}
	r := e.Do(t, http.MethodPut, AdminPath(sku)+"/seats", nil, `{"seats":[`+strings.Join(parts, ",")+`]}`)
	if r.Status != http.StatusOK {
		t.Fatalf("PUT seats = %d %s", r.Status, r.Body)
	}
}

// SeatHold holds the given seats of sku for buyer.
func (e *Env) SeatHold(t *testing.T, sku stock.SKU, key, buyer string, seats ...string) (Reply, HoldReply) {
	b, _ := json.Marshal(map[string]any{"buyer": buyer, "seats": seats})
	r := e.Do(t, http.MethodPost, SKUPath(sku)+"/seat-holds", map[string]string{"Idempotency-Key": key}, string(b))
	var h HoldReply
	_ = json.Unmarshal(r.Body, &h)
	return r, h
}

// PoolReply is a pool as the admin API shows it.
type PoolReply struct {
	Pool      string `json:"pool"`
	Allotment int64  `json:"allotment"`
	Sold      int64  `json:"sold"`
	Held      int64  `json:"held"`
	Remaining int64  `json:"remaining"`
	ClosedAt  string `json:"closed_at"`
}

// PutPool creates or changes a pool of sku with body, or fails the test.
func (e *Env) PutPool(t *testing.T, sku stock.SKU, pool, body string) PoolReply {
	t.Helper()
	r := e.Do(t, http.MethodPut, AdminPath(sku)+"/pools/"+pool, nil, body)
	if r.Status != http.StatusOK {
		t.Fatalf("PUT pool %s = %d %s", pool, r.Status, r.Body)
	}
	var p PoolReply
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// WaitReply is a buyer's waitlist entry.
type WaitReply struct {
	State    string     `json:"state"`
	Position int64      `json:"position"`
	Quantity int64      `json:"quantity"`
	Offer    *HoldReply `json:"offer"`
}

// WaitPath is the path of buyer's waitlist entry for sku.
func WaitPath(sku stock.SKU, buyer string) string {
	return SKUPath(sku) + "/waitlist/" + buyer
}

// Join puts buyer on sku's waitlist for q.
func (e *Env) Join(t *testing.T, sku stock.SKU, buyer string, q int64) (Reply, WaitReply) {
	r := e.Do(t, http.MethodPut, WaitPath(sku, buyer), nil, fmt.Sprintf(`{"quantity":%d}`, q))
	var w WaitReply
	_ = json.Unmarshal(r.Body, &w)
	return r, w
}

// Entry reads buyer's waitlist entry for sku, or fails the test.
func (e *Env) Entry(t *testing.T, sku stock.SKU, buyer string) WaitReply {
	t.Helper()
	r := e.Do(t, http.MethodGet, WaitPath(sku, buyer), nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET waitlist %s = %d %s", buyer, r.Status, r.Body)
	}
	var w WaitReply
	if err := json.Unmarshal(r.Body, &w); err != nil {
		t.Fatal(err)
	}
	return w
}
