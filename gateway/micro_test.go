package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

// BenchmarkMicroParsePurchase is the request parsing of a purchase: strict
// JSON decode under the size limit.
func BenchmarkMicroParsePurchase(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	s := &Server{opts: Options{MaxBodyBytes: 4 << 10}}
	for b.Loop() {
		c, _ := gin.CreateTestContext(httptest.NewRecorder())
		c.Request = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"buyer":"alice","quantity":2}`))
		c.Request.Header.Set("Content-Type", "application/json")
		var body purchaseBody
		if !s.decodeBody(c, &body) || body.Quantity == nil {
			b.Fatal("decode failed")
		}
	}
}
