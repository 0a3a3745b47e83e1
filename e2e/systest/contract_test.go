package systest

import (
	"net/http"
	"testing"
)

// The checker itself: it refuses what the document does not say.
func TestContractChecker(t *testing.T) {
	c, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	pj := http.Header{"Content-Type": {"application/problem+json"}}
	js := http.Header{"Content-Type": {"application/json"}}
	for _, bad := range []struct {
		method, path string
		status       int
		header       http.Header
		body         string
	}{
		{"POST", "/v1/skus/p/t/purchases", 299, js, `{}`},                                    // undocumented status
		{"POST", "/v1/skus/p/t/purchases", 201, js, `{"order_id":5}`},                        // wrong type
		{"POST", "/v1/skus/p/t/purchases", 201, pj, `{"order_id":"o"}`},                      // wrong media type
		{"POST", "/v1/skus/p/t/purchases", 409, pj, `{"type":"x","title":"t","status":409}`}, // not a problem type
		{"PATCH", "/v1/skus/p/t/purchases", 200, js, `{}`},                                   // undocumented method
	} {
		if c.check(bad.method, bad.path, bad.status, bad.header, []byte(bad.body)) == "" {
			t.Errorf("the checker accepted %+v", bad)
		}
	}
}
