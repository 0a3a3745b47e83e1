package main

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// `stockgate smoke`, what the chart's helm test pod runs against the
// Service: against a gateway with an admin token it buys a ticket and
// refunds it, exit 0, as many times as it is run (the ticket's stock stays
// whole); a wrong token or no URL exit 1 naming the step that failed.
func TestSmokeCommand(t *testing.T) {
	const token = "smoke-admin-token"
	c := testenv.SharedCluster(t)
	dsn := filepath.Join(t.TempDir(), "smoke.db")
	e := startServe(t, "STOCKGATE_REDIS_ADDRS="+strings.Join(c.Addrs(), ","), "STOCKGATE_ADMIN_TOKEN="+token,
		"STOCKGATE_LEDGER_DSN="+dsn, "STOCKGATE_LOG_LEVEL=warn")
	waitUntil(t, 20*time.Second, func() bool {
		resp, err := http.Get(e.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	for range 2 {
		var log strings.Builder
		if code := run([]string{"smoke", "-smoke-url", e.base, "-admin-token", token}, &log); code != 0 {
			t.Fatalf("stockgate smoke = exit %d:\n%s", code, log.String())
		}
		if !strings.Contains(log.String(), "smoke test passed") {
			t.Errorf("stockgate smoke logged:\n%s", log.String())
		}
	}
	l, err := ledger.Open(context.Background(), ledger.Options{Driver: ledger.SQLite, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sku := stock.SKU{Program: keys.MustID(smokeSKU.Program), Ticket: keys.MustID(smokeSKU.Ticket)}
	st, err := l.SKU(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	orders, _, err := l.OrderTotals(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	if st.Sold != 0 || st.Total != 1000 || orders != 0 {
		t.Errorf("the smoke ticket after two runs: %+v with %d standing orders, want all 1000 back", st, orders)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"smoke", "-smoke-url", e.base, "-admin-token", "not-the-admin-token-0"}, "set up the smoke ticket"},
		{[]string{"smoke", "-admin-token", token}, "STOCKGATE_SMOKE_URL"},
	} {
		var log strings.Builder
		if code := run(c.args, &log); code != 1 || !strings.Contains(log.String(), c.want) {
			t.Errorf("stockgate %v = exit %d, want 1 saying %q:\n%s", c.args, code, c.want, log.String())
		}
	}
}
