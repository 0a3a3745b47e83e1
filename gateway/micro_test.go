package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/stock"
)

// BenchmarkMicroParsePurchase is the request parsing of a purchase: strict
// JSON decode under the size limit, id checks, and the request hash.
func BenchmarkMicroParsePurchase(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	s := &Server{opts: Options{MaxBodyBytes: 4 << 10}}
	sku := stock.SKU{Program: "show-1", Ticket: "ga"}
	for b.Loop() {
		c, _ := gin.CreateTestContext(httptest.NewRecorder())
		c.Request = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"buyer":"alice","quantity":2}`))
		c.Request.Header.Set("Content-Type", "application/json")
		var body purchaseBody
		if !s.decodeBody(c, &body) || body.Quantity == nil {
			b.Fatal("decode failed")
		}
		_ = newRequest(body.Buyer, "k", "purchase", sku.Program, sku.Ticket, "2").gateID()
	}
}
