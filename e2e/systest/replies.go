package systest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// ProblemKind is the last segment of a problem answer's type
// ("sold-out" of ".../problems/sold-out"), or "".
func ProblemKind(r Reply) string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(r.Body, &p)
	for i := len(p.Type) - 1; i >= 0; i-- {
		if p.Type[i] == '/' {
			return p.Type[i+1:]
		}
	}
	return p.Type
}

// ReplyID is the id an answer is about: a cart's, an order's, a hold's.
func ReplyID(r Reply) string {
	var v struct {
		CartID  string `json:"cart_id"`
		OrderID string `json:"order_id"`
		HoldID  string `json:"hold_id"`
	}
	_ = json.Unmarshal(r.Body, &v)
	return cmp.Or(v.CartID, v.OrderID, v.HoldID)
}

// CartBody is the JSON of a cart of the given ticket:quantity lines.
func CartBody(buyer string, lines map[string]int64, order ...string) string {
	var ls []string
	for _, t := range order {
		if q, ok := lines[t]; ok {
			ls = append(ls, fmt.Sprintf(`{"ticket":%q,"quantity":%d}`, t, q))
		}
	}
	return fmt.Sprintf(`{"buyer":%q,"lines":[%s]}`, buyer, strings.Join(ls, ","))
}

// CartSKUs creates adult, child and parking tickets of a new program with
// the given totals (shards 4, 2, 1; up to 4 per order) and a program cap.
func CartSKUs(t *testing.T, e *Env, totals [3]int64, programCap int64) (keys.ID, []stock.SKU) {
	t.Helper()
	p := keys.MustID(testenv.ID(t, "cart"))
	var skus []stock.SKU
	for i, name := range []string{"adult", "child", "parking"} {
		s := stock.SKU{Program: p, Ticket: keys.MustID(name)}
		e.PutSKU(t, s, totals[i], []int{4, 2, 1}[i], 4)
		skus = append(skus, s)
	}
	if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+p.String(), nil, fmt.Sprintf(`{"per_buyer":%d}`, programCap)); r.Status != http.StatusOK {
		t.Fatalf("PUT program = %d %s", r.Status, r.Body)
	}
	return p, skus
}
