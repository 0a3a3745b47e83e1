package systest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/stock"
)

// Reply is one answer of the replica.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// Do sends one request (a JSON body when body is not empty) and returns
// the answer, which it checks against the OpenAPI document (see
// CheckContract). A request that gets no answer fails the test and
// returns the zero Reply.
func (e *Env) Do(t *testing.T, method, path string, header map[string]string, body string) Reply {
	t.Helper()
	req, err := http.NewRequest(method, e.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := e.Client.Do(req)
	if err != nil {
		t.Error(err)
		return Reply{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := Reply{resp.StatusCode, resp.Header, b}
	CheckContract(t, method, path, r)
	return r
}

// SKUPath is the public path of a SKU.
func SKUPath(sku stock.SKU) string {
	return "/v1/skus/" + sku.Program.String() + "/" + sku.Ticket.String()
}

// AdminPath is the admin path of a SKU.
func AdminPath(sku stock.SKU) string {
	return "/v1/admin/skus/" + sku.Program.String() + "/" + sku.Ticket.String()
}

// PutSKU creates or changes a SKU, or fails the test.
func (e *Env) PutSKU(t *testing.T, sku stock.SKU, total int64, shards int, maxPerOrder int64) {
	t.Helper()
	// A 503 (the ledger's answer was lost on a busy machine) is retried,
	// as an operator would. So is a 200 that left the gate unseeded (its
	// re-seed timed out: the service rebuilds it on the next purchase),
	// since a test that then refuses everything would read an empty gate;
	// the same PUT again re-seeds it. With Redis unreachable the 200
	// stands: the test is about the gate being down.
	var r Reply
	// 30 s: a bound, not a timing (10 s ran out once in a loaded make test).
	WaitFor(t, 30*time.Second, "PUT sku answered, the gate seeded", func() bool {
		r = e.Do(t, http.MethodPut, AdminPath(sku), nil,
			fmt.Sprintf(`{"total":%d,"shards":%d,"max_per_order":%d}`, total, shards, maxPerOrder))
		if r.Status != http.StatusOK {
			return r.Status != http.StatusServiceUnavailable
		}
		_, seeded, err := e.Gate.Remaining(context.Background(), sku, shards)
		return seeded || err != nil
	})
	if r.Status != http.StatusOK {
		t.Fatalf("PUT sku = %d %s", r.Status, r.Body)
	}
}

// PutCapped creates or changes a SKU of 100 units, up to 4 per order and
// perBuyer per buyer.
func (e *Env) PutCapped(t *testing.T, sku stock.SKU, shards int, perBuyer int64) {
	t.Helper()
	r := e.Do(t, http.MethodPut, AdminPath(sku), nil,
		fmt.Sprintf(`{"total":100,"shards":%d,"max_per_order":4,"per_buyer":%d}`, shards, perBuyer))
	if r.Status != http.StatusOK {
		t.Fatalf("PUT sku = %d %s", r.Status, r.Body)
	}
}

// Buy purchases q of sku for buyer under the Idempotency-Key key.
func (e *Env) Buy(t *testing.T, sku stock.SKU, key, buyer string, q int64) Reply {
	return e.Do(t, http.MethodPost, SKUPath(sku)+"/purchases",
		map[string]string{"Idempotency-Key": key}, fmt.Sprintf(`{"buyer":%q,"quantity":%d}`, buyer, q))
}

// MustBuy is Buy for a purchase the test needs: anything but 201 ends it.
func (e *Env) MustBuy(t *testing.T, sku stock.SKU, key, buyer string, q int64) Reply {
	t.Helper()
	r := e.Buy(t, sku, key, buyer, q)
	if r.Status != http.StatusCreated {
		t.Fatalf("purchase %s = %d %s", key, r.Status, r.Body)
	}
	return r
}

// BuyAll sends n purchases from `workers` concurrent clients; buy(i) makes
// the i-th. It returns the count of each status.
func BuyAll(n, workers int, buy func(i int) Reply) map[int]int {
	counts := make(map[int]int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range work {
				r := buy(i)
				mu.Lock()
				counts[r.Status]++
				mu.Unlock()
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return counts
}

// OrderID is the order_id of an answer, or "".
func OrderID(r Reply) string {
	var v struct {
		OrderID string `json:"order_id"`
	}
	_ = json.Unmarshal(r.Body, &v)
	return v.OrderID
}

// Retried sends a keyed request as a platform's worker does: a 503 or 429
// is sent again with the same key after its Retry-After (at most 2 s
// apart, for 30 s in all). It returns the last answer and how many
// answers came before it.
func (e *Env) Retried(t *testing.T, method, path, key, body string) (Reply, int) {
	t.Helper()
	give := time.Now().Add(30 * time.Second)
	for tries := 0; ; tries++ {
		r := e.Do(t, method, path, map[string]string{"Idempotency-Key": key}, body)
		if r.Status != http.StatusServiceUnavailable && r.Status != http.StatusTooManyRequests || time.Now().After(give) {
			return r, tries
		}
		wait := time.Second
		if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err == nil {
			wait = time.Duration(min(max(s, 0), 2)) * time.Second
		}
		time.Sleep(wait) // time under test: a client's wait, as Retry-After says
	}
}
