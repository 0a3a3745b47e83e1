package security_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/ledger"
)

// Admin calls without the token, or with a wrong one, get 401 and change
// nothing; a body over the limit gets 413; a client over its rate gets 429
// with Retry-After, and cannot dodge it with a forged X-Forwarded-For.
func TestSecurityLimits(t *testing.T) {
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Tune: func(o *app.Options) {
		o.HTTP.AdminToken = "s3cret-admin-token"
	}})
	sku := systest.NewSKU(t)
	auth := map[string]string{"Authorization": "Bearer s3cret-admin-token"}
	path := "/v1/admin/skus/" + sku.Program.String() + "/" + sku.Ticket.String()
	if r := e.Do(t, http.MethodPut, path, auth, `{"total":10}`); r.Status != http.StatusOK {
		t.Fatalf("PUT with the token = %d %s", r.Status, r.Body)
	}
	before := e.State(t, sku)
	for _, h := range []map[string]string{nil, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-admin-token"}, {"Authorization": "Basic czNjcmV0LXRva2Vu"}} {
		for _, call := range []struct{ method, path, body string }{
			{http.MethodPut, path, `{"total":99}`},
			{http.MethodPost, path + "/end", ""},
			{http.MethodPost, path + "/reconcile", ""},
			{http.MethodGet, path, ""},
			{http.MethodPut, "/v1/admin/programs/" + sku.Program.String(), `{"per_buyer":1}`},
		} {
			r := e.Do(t, call.method, call.path, h, call.body)
			if r.Status != http.StatusUnauthorized || r.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s %s with %v = %d, want 401 with WWW-Authenticate", call.method, call.path, h, r.Status)
			}
		}
	}
	if got := e.State(t, sku); got != before {
		t.Errorf("refused admin calls changed the SKU: %+v → %+v", before, got)
	}
	if st, _ := e.Ledger.SKU(t.Context(), sku); !st.EndedAt.IsZero() || st.Total != 10 {
		t.Errorf("SKU after refused admin calls: %+v", st)
	}

	big := fmt.Sprintf(`{"buyer":"b","quantity":1,"pad":%q}`, strings.Repeat("x", 5000))
	if r := e.Do(t, http.MethodPost, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/purchases", map[string]string{"Idempotency-Key": "big"}, big); r.Status != http.StatusRequestEntityTooLarge {
		t.Errorf("5 KB body = %d, want 413", r.Status)
	}

	// 20 burst + 5/s: 60 quick reads from one client, many refused; a forged
	// X-Forwarded-For does not make a new client (no proxy is trusted).
	e = systest.Start(t, systest.Options{Driver: ledger.SQLite, Tune: func(o *app.Options) { o.HTTP.RatePerClient, o.HTTP.RateBurst = 5, 20 }})
	e.PutSKU(t, sku, 10, 1, 4)
	limited, retry, retries := 0, "", map[string]bool{}
	for i := range 60 {
		r := e.Do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/stock",
			map[string]string{"X-Forwarded-For": fmt.Sprintf("10.0.0.%d", i)}, "")
		if r.Status == http.StatusTooManyRequests {
			limited++
			retry = r.Header.Get("Retry-After")
			retries[retry] = true
			if r.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("429 content type %q", r.Header.Get("Content-Type"))
			}
		}
	}
	if limited < 30 || retry == "" {
		t.Errorf("%d of 60 requests limited (Retry-After %q), want most of the 40 over the burst, with Retry-After", limited, retry)
	}
	// The next token comes within 0.2 s (5/s): 1 or 2 seconds, spread.
	if !retries["1"] || !retries["2"] || len(retries) != 2 {
		t.Errorf("429 Retry-After values %v, want 1 and 2", retries)
	}
	if r := e.Do(t, http.MethodGet, "/readyz", nil, ""); r.Status != http.StatusOK {
		t.Errorf("/readyz while the client is limited = %d, want 200 (health checks are not limited)", r.Status)
	}

	// Behind a trusted proxy (here the test client's own address), the
	// forwarded address is the client: 60 different clients, none limited.
	e = systest.Start(t, systest.Options{Driver: ledger.SQLite, Tune: func(o *app.Options) {
		o.HTTP.RatePerClient, o.HTTP.RateBurst, o.HTTP.TrustedProxies = 5, 20, []string{"127.0.0.1"}
	}})
	e.PutSKU(t, sku, 10, 1, 4)
	for i := range 60 {
		r := e.Do(t, http.MethodGet, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/stock",
			map[string]string{"X-Forwarded-For": fmt.Sprintf("10.0.0.%d", i)}, "")
		if r.Status != http.StatusOK {
			t.Fatalf("client %d behind the trusted proxy = %d", i, r.Status)
		}
	}
}

// With SeparateAdmin, /metrics and the admin routes are not on the public
// handler (404, as any unknown route) but on the admin one, which still
// asks for the token; the buyers' API stays public.
func TestSeparateAdminListener(t *testing.T) {
	token := "a-long-enough-admin-token"
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Tune: func(o *app.Options) {
		o.HTTP.SeparateAdmin, o.HTTP.AdminToken = true, token
	}})
	admin := httptest.NewServer(e.Server.AdminHandler())
	defer admin.Close()
	sku := systest.NewSKU(t)
	path := "/v1/admin/skus/" + sku.Program.String() + "/" + sku.Ticket.String()
	auth := map[string]string{"Authorization": "Bearer " + token}
	if r := e.Do(t, http.MethodPut, path, auth, `{"total":5,"shards":1,"max_per_order":2}`); r.Status != http.StatusNotFound {
		t.Errorf("admin route on the public listener = %d, want 404", r.Status)
	}
	if r := e.Do(t, http.MethodGet, "/metrics", nil, ""); r.Status != http.StatusNotFound {
		t.Errorf("/metrics on the public listener = %d, want 404", r.Status)
	}
	pub := e.URL
	e.URL = admin.URL
	if r := e.Do(t, http.MethodPut, path, nil, `{"total":5,"shards":1,"max_per_order":2}`); r.Status != http.StatusUnauthorized {
		t.Errorf("admin route without the token on the admin listener = %d, want 401", r.Status)
	}
	if r := e.Do(t, http.MethodPut, path, auth, `{"total":5,"shards":1,"max_per_order":2}`); r.Status != http.StatusOK {
		t.Fatalf("admin route on the admin listener = %d %s", r.Status, r.Body)
	}
	if r := e.Do(t, http.MethodGet, "/metrics", nil, ""); r.Status != http.StatusOK {
		t.Errorf("/metrics on the admin listener = %d", r.Status)
	}
	if r := e.Buy(t, sku, "sep-1", "sep-b", 1); r.Status != http.StatusNotFound {
		t.Errorf("a purchase on the admin listener = %d, want 404", r.Status)
	}
	e.URL = pub
	if r := e.Buy(t, sku, "sep-1", "sep-b", 1); r.Status != http.StatusCreated {
		t.Errorf("a purchase on the public listener = %d %s", r.Status, r.Body)
	}
}
