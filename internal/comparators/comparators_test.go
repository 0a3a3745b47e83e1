package comparators_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stockgate/stockgate/internal/comparators"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/stock"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// Each Redis comparator sells exactly its stock to concurrent buyers (the
// benchmark reports their oversell, so it must count right).
func TestComparatorsSellTheirStock(t *testing.T) {
	rdb := testenv.SharedCluster(t).Client()
	defer rdb.Close()
	for _, c := range []*comparators.Comparator{comparators.Floor(rdb), comparators.DecrIncr(rdb), comparators.Lock(rdb)} {
		t.Run(c.Name, func(t *testing.T) {
			program := testenv.ID(t, "c")
			if err := c.Seed(context.Background(), stock.MustSKU(program, "ga"), 10); err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(c.Handler)
			defer srv.Close()
			var mu sync.Mutex
			codes := map[int]int{}
			var wg sync.WaitGroup
			for i := range 40 {
				wg.Go(func() {
					resp, err := http.Post(srv.URL+"/v1/skus/"+program+"/ga/purchases", "application/json",
						strings.NewReader(fmt.Sprintf(`{"buyer":"b%d","quantity":1}`, i)))
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					mu.Lock()
					codes[resp.StatusCode]++
					mu.Unlock()
				})
			}
			wg.Wait()
			if codes[201] != 10 || c.Sold.Load() != 10 {
				t.Errorf("answers %v, counted %d sold; want exactly 10", codes, c.Sold.Load())
			}
		})
	}
}
