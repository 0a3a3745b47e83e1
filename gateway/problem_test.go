package gateway

import (
	"net/http"
	"testing"

	"github.com/stockgate/stockgate/sale"
)

// Every kind of sale error has a status: a kind missing from statusOf
// would reach clients as a 500.
func TestEveryErrorHasAStatus(t *testing.T) {
	for _, k := range sale.Kinds() {
		st, ok := statusOf[k]
		if !ok {
			t.Errorf("sale error %q has no status in statusOf", k.Code)
			continue
		}
		if st < 400 || st == http.StatusInternalServerError {
			t.Errorf("sale error %q maps to %d", k.Code, st)
		}
	}
	if len(statusOf) != len(sale.Kinds()) {
		t.Errorf("statusOf has %d entries for %d kinds", len(statusOf), len(sale.Kinds()))
	}
}
