package purchase_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/gateway"
	"github.com/stockgate/stockgate/ledger"
)

// TestBadInput: every malformed request is a 4xx problem+json that changes
// nothing in Redis or the ledger.
func TestBadInput(t *testing.T) {
	systest.EachDriver(t, func(t *testing.T, driver string) {
		e := systest.New(t, driver)
		sku := systest.NewSKU(t)
		e.PutSKU(t, sku, 20, 4, 4)
		base := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/purchases"
		key := map[string]string{"Idempotency-Key": "k-1"}
		long := strings.Repeat("x", 65)
		tests := []struct {
			name   string
			path   string
			header map[string]string
			body   string
			want   int
		}{
			{"program with {", "/v1/skus/a%7Bb/ga/purchases", key, `{"buyer":"b","quantity":1}`, 400},
			{"program with }", "/v1/skus/a%7Db/ga/purchases", key, `{"buyer":"b","quantity":1}`, 400},
			{"program with space", "/v1/skus/a%20b/ga/purchases", key, `{"buyer":"b","quantity":1}`, 400},
			{"program of 65", "/v1/skus/" + long + "/ga/purchases", key, `{"buyer":"b","quantity":1}`, 400},
			{"empty ticket", "/v1/skus/" + sku.Program.String() + "//purchases", key, `{"buyer":"b","quantity":1}`, 400},
			{"buyer with {", base, key, `{"buyer":"{b}","quantity":1}`, 422},
			{"buyer of 65", base, key, `{"buyer":"` + long + `","quantity":1}`, 422},
			{"empty buyer", base, key, `{"buyer":"","quantity":1}`, 422},
			{"key with space", base, map[string]string{"Idempotency-Key": "a b"}, `{"buyer":"b","quantity":1}`, 400},
			{"key of 65", base, map[string]string{"Idempotency-Key": long}, `{"buyer":"b","quantity":1}`, 400},
			{"no key", base, nil, `{"buyer":"b","quantity":1}`, 400},
			{"q=0", base, key, `{"buyer":"b","quantity":0}`, 422},
			{"q=-1", base, key, `{"buyer":"b","quantity":-1}`, 422},
			{"q=1.5", base, key, `{"buyer":"b","quantity":1.5}`, 422},
			{`q="1"`, base, key, `{"buyer":"b","quantity":"1"}`, 422},
			{"q=1e3", base, key, `{"buyer":"b","quantity":1e3}`, 422},
			{"q=1000 over max", base, key, `{"buyer":"b","quantity":1000}`, 422},
			{"q=5 over max 4", base, key, `{"buyer":"b","quantity":5}`, 422},
			{"q=2^63", base, key, `{"buyer":"b","quantity":9223372036854775808}`, 422},
			{"q missing", base, key, `{"buyer":"b"}`, 422},
			{"malformed JSON", base, key, `{"buyer":"b","quantity":1`, 400},
			{"unknown field", base, key, `{"buyer":"b","quantity":1,"price":0}`, 400},
			{"two objects", base, key, `{"buyer":"b","quantity":1}{"buyer":"b","quantity":1}`, 400},
			{"not JSON", base, key, `quantity=1`, 400},
			{"body over limit", base, key, `{"buyer":"b","quantity":1,"pad":"` + strings.Repeat("x", 5000) + `"}`, 413},
			{"valid object then padding over limit", base, key, `{"buyer":"b","quantity":1}` + strings.Repeat(" ", 5000), 413},
			{"unknown sku", "/v1/skus/" + sku.Program.String() + "/nope/purchases", key, `{"buyer":"b","quantity":1}`, 404},
			// A pair the query's reader drops (a ";", a bad escape) was
			// read as no pool: a public ticket sold to a buyer who named
			// a presale (helper-106).
			{"query with ;", base + "?pool=fan;x", key, `{"buyer":"b","quantity":1}`, 400},
			{"query with a bad escape", base + "?pool=%zz", key, `{"buyer":"b","quantity":1}`, 400},
			{"query with ; and no pool", base + "?x=1;y=2", key, `{"buyer":"b","quantity":1}`, 400},
		}
		for _, tt := range tests {
			before := e.State(t, sku)
			r := e.Do(t, http.MethodPost, tt.path, tt.header, tt.body)
			if r.Status != tt.want {
				t.Errorf("%s: status %d %s, want %d", tt.name, r.Status, r.Body, tt.want)
				continue
			}
			var p gateway.Problem
			if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("%s: Content-Type %q, want application/problem+json", tt.name, ct)
			}
			if err := json.Unmarshal(r.Body, &p); err != nil || p.Status != tt.want || p.Type == "" || p.Title == "" {
				t.Errorf("%s: problem body %s: %v", tt.name, r.Body, err)
			}
			if got := e.State(t, sku); got != before {
				t.Errorf("%s: state changed from %+v to %+v", tt.name, before, got)
			}
		}
		// The key used by every refused request above is still free: a good
		// request with it succeeds, so none of them left a record behind.
		if r := e.Buy(t, sku, "k-1", "b", 1); r.Status != 201 {
			t.Errorf("purchase after bad inputs = %d %s, want 201", r.Status, r.Body)
		}
	})
}

// encoding/json matches member names case-insensitively, and the
// duplicate check compares them exactly: {"quantity":1,"QUANTITY":3} is
// read as 3 and accepted, the ambiguity the duplicate check is there to
// refuse ("bad input gets a clear 4xx").
func TestAttackCaseFoldedDuplicateMember(t *testing.T) {
	systest.FullTier(t)
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 1, 4)
	for i, body := range []string{
		`{"buyer":"ann","quantity":1,"QUANTITY":3}`,
		`{"buyer":"ann","Buyer":"bob","quantity":1}`,
	} {
		r := e.Do(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", map[string]string{"Idempotency-Key": fmt.Sprintf("cf%d", i)}, body)
		if r.Status != 400 {
			t.Errorf("%s = %d %s, want 400 (a member given twice)", body, r.Status, r.Body)
		}
	}
}

// Media types compare case-insensitively and whole (RFC 9110): any case of
// application/json is JSON, application/jsonfoo is not; a JSON body that is
// not an object is malformed (400), and the problem names no Go type.
func TestAttackMediaTypesAndNonObjectBodies(t *testing.T) {
	systest.FullTier(t)
	e := systest.New(t, ledger.SQLite)
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 10, 1, 4)
	path := "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String() + "/purchases"
	body := `{"buyer":"ann","quantity":1}`
	if r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "m1", "Content-Type": "Application/JSON; charset=UTF-8"}, body); r.Status != http.StatusCreated {
		t.Errorf("Application/JSON = %d %s, want 201", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "m2", "Content-Type": "application/jsonfoo"}, body); r.Status != http.StatusUnsupportedMediaType {
		t.Errorf("application/jsonfoo = %d %s, want 415", r.Status, r.Body)
	}
	r := e.Do(t, http.MethodPut, systest.AdminPath(sku), nil, `[]`)
	if r.Status != http.StatusBadRequest || strings.Contains(string(r.Body), "gateway.") {
		t.Errorf("PUT [] = %d %s, want 400 naming no Go type", r.Status, r.Body)
	}
	if st := e.State(t, sku); st.Sold != 1 {
		t.Errorf("sold %d, want 1", st.Sold)
	}
}
