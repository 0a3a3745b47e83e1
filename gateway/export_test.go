package gateway

import (
	"strconv"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// PurchaseGateID is the id of a purchase's records in Redis, for tests
// that act on Redis behind the gateway's back (a crash between Redis and
// the ledger, a lost reply).
func PurchaseGateID(buyer, key string, sku stock.SKU, q int64) string {
	return newRequest(buyer, key, ledger.OpPurchase, sku.Program, sku.Ticket, strconv.FormatInt(q, 10)).gateID()
}
