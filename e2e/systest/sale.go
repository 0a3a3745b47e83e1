package systest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"golang.org/x/time/rate"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// FlashSale drives a flash sale the way real clients do: each worker buys one
// ticket at a time with a fresh Idempotency-Key, retries a 503 with the same
// key after a pause, and moves on after a 201 or a 409. It records every
// answer, and optionally the history for a linearizability check.
type FlashSale struct {
	t       *testing.T
	envs    []*Env
	sku     stock.SKU
	total   int64
	started time.Time
	who     string        // prefix of its keys and buyers (StartSaleAs)
	pace    *rate.Limiter // new purchases a second, all workers together (nil: as fast as they go)

	mu       sync.Mutex
	counts   map[int]int
	orders   map[string]string // key → order id of its 201
	pending  map[string]bool   // keys whose last answer was a 503
	ops      []porcupine.Operation
	oks      []time.Time // when each 201 arrived
	first409 time.Time
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// StartSale starts workers buying sku's total units from the replicas
// (worker w from envs[w%len(envs)]) until the test ends or Oracle or
// Linearizable stop them.
func StartSale(t *testing.T, envs []*Env, sku stock.SKU, total int64, workers int) *FlashSale {
	return StartSaleAs(t, envs, sku, total, workers, "")
}

// StartSaleAs is StartSale with keys and buyers of its own (each begins
// with who): two sales at once on one ledger.
func StartSaleAs(t *testing.T, envs []*Env, sku stock.SKU, total int64, workers int, who string) *FlashSale {
	return startSale(t, envs, sku, total, workers, who, nil)
}

// StartSalePaced is StartSale with the workers starting at most perSec new
// purchases a second between them (a retry of a 503 is not a new one): a
// fault test whose faults take their own time (a failover) sells no more
// than it needs to land each fault mid-sale, and spends the machine's CPU
// on the faults, not on a sale at full speed beside them.
func StartSalePaced(t *testing.T, envs []*Env, sku stock.SKU, total int64, workers int, perSec float64) *FlashSale {
	return startSale(t, envs, sku, total, workers, "", rate.NewLimiter(rate.Limit(perSec), 1))
}

func startSale(t *testing.T, envs []*Env, sku stock.SKU, total int64, workers int, who string, pace *rate.Limiter) *FlashSale {
	s := &FlashSale{t: t, envs: envs, sku: sku, total: total, started: time.Now(), who: who, pace: pace,
		counts: map[int]int{}, orders: map[string]string{}, pending: map[string]bool{}, stop: make(chan struct{})}
	for w := range workers {
		s.wg.Go(func() { s.worker(w) })
	}
	t.Cleanup(s.halt)
	return s
}

// Unpace lets a paced sale's workers go as fast as they can: the faults
// are over, the rest only needs selling.
func (s *FlashSale) Unpace() {
	if s.pace != nil {
		s.pace.SetLimit(rate.Inf)
	}
}

// Pace sets a paced sale's pace again: perSec new purchases a second.
func (s *FlashSale) Pace(perSec float64) {
	if s.pace != nil {
		s.pace.SetLimit(rate.Limit(perSec))
	}
}

// paced waits for the pace's next purchase; false when the sale stops.
func (s *FlashSale) paced() bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return s.pace.Wait(ctx) == nil
}

func (s *FlashSale) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

func (s *FlashSale) worker(w int) {
	e := s.envs[w%len(s.envs)]
	for n := 0; !s.stopped(); n++ {
		if s.pace != nil && !s.paced() {
			return
		}
		key := fmt.Sprintf("%sw%d-%d", s.who, w, n)
		call := time.Since(s.started).Nanoseconds()
		for {
			r := e.Buy(s.t, s.sku, key, fmt.Sprintf("%sbuyer-%d", s.who, w), 1)
			ret := time.Since(s.started).Nanoseconds()
			s.mu.Lock()
			s.counts[r.Status]++
			switch r.Status {
			case http.StatusCreated:
				var v struct {
					OrderID string `json:"order_id"`
				}
				_ = json.Unmarshal(r.Body, &v)
				s.orders[key] = v.OrderID
				delete(s.pending, key)
				s.oks = append(s.oks, time.Now())
				s.ops = append(s.ops, porcupine.Operation{ClientId: w, Input: int64(1), Call: call, Output: true, Return: ret})
			case http.StatusConflict:
				if s.first409.IsZero() {
					s.first409 = time.Now()
				}
				delete(s.pending, key)
				s.ops = append(s.ops, porcupine.Operation{ClientId: w, Input: int64(1), Call: call, Output: false, Return: ret})
			default:
				s.pending[key] = true
			}
			s.mu.Unlock()
			if r.Status != http.StatusServiceUnavailable || s.stopped() {
				break
			}
			time.Sleep(20 * time.Millisecond) // time under test: a worker's pause before it retries a 503
		}
		if s.soldOutSeen() {
			// Past the end: slow down, the monitor decides when to stop.
			time.Sleep(20 * time.Millisecond) // time under test: the workers' pace past the end
		}
	}
}

// buyerOf is the buyer of a worker's key ("w3-17" is buyer-3's).
func (s *FlashSale) buyerOf(key string) string {
	w, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(key, s.who), "w"), "-")
	return s.who + "buyer-" + w
}

func (s *FlashSale) soldOutSeen() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[http.StatusConflict] > 0
}

// halt stops the workers and waits for them.
func (s *FlashSale) halt() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
}

// WaitSold waits until the ledger has sold at least n units, or fails.
func (s *FlashSale) WaitSold(n int64, within time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := s.envs[0].Ledger.SKU(context.Background(), s.sku)
		if err == nil && st.Sold >= n {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("ledger sold %d (err %v) after %v, want %d", st.Sold, err, within, n)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

// FirstOKAfter is how long after t0 the first 201 arrived (-1: none).
func (s *FlashSale) FirstOKAfter(t0 time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, at := range s.oks {
		if at.After(t0) {
			return at.Sub(t0)
		}
	}
	return -1
}

// Oracle is the check every fault test ends with, against the ledger:
// sold + held <= total, the order rows add up to what the SKU row says,
// every 201 names an order the ledger has under its key, and no key has
// more than one order (the ledger's unique key; counted here).
func (s *FlashSale) Oracle() ledger.SKUState {
	s.t.Helper()
	s.halt()
	ctx := context.Background()
	led := s.envs[0].Ledger
	st, err := led.SKU(ctx, s.sku)
	if err != nil {
		s.t.Fatal(err)
	}
	orders, units, err := led.OrderTotals(ctx, s.sku)
	if err != nil {
		s.t.Fatal(err)
	}
	if st.Sold+st.Held > st.Total {
		s.t.Errorf("OVERSOLD: sold %d + held %d > total %d", st.Sold, st.Held, st.Total)
	}
	if units != st.Sold {
		s.t.Errorf("order rows hold %d units, SKU row says sold %d", units, st.Sold)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, id := range s.orders {
		o, err := OrderOf(ctx, led, s.buyerOf(key), key)
		if err != nil || o.ID.String() != id {
			s.t.Errorf("201 for key %s order %s; ledger has %+v, %v", key, id, o, err)
		}
	}
	if int64(len(s.orders)) > orders {
		s.t.Errorf("%d keys answered 201 but only %d orders", len(s.orders), orders)
	}
	// A 409 before the last 201 was a false sold-out: Redis (or the cached
	// flag) said none left while the ledger still had stock.
	window := time.Duration(0)
	if n := len(s.oks); n > 0 && !s.first409.IsZero() && s.oks[n-1].After(s.first409) {
		window = s.oks[n-1].Sub(s.first409)
	}
	s.t.Logf("oracle: total %d sold %d held %d; orders %d (units %d); answers %v; keys left at 503: %d; false sold-out window %v",
		st.Total, st.Sold, st.Held, orders, units, s.counts, len(s.pending), window.Round(time.Millisecond))
	return st
}

// Linearizable checks the single-shard history against a counter holding
// the SKU's stock: a 201 takes one unit, which must be there. With strict,
// a 409 must also be explained by an empty counter; without it, a 409
// proves nothing (Redis may be behind the ledger for a bounded time after a
// fault, a false sold-out, which invariant 5 bounds and does not forbid).
// Keys whose outcome the clients never learned are resolved from the
// ledger: an order there is a 201 that may have happened any time after
// the call.
func (s *FlashSale) Linearizable(strict bool) {
	s.t.Helper()
	s.halt()
	s.mu.Lock()
	ops := append([]porcupine.Operation(nil), s.ops...)
	for key := range s.pending {
		if _, err := OrderOf(context.Background(), s.envs[0].Ledger, s.buyerOf(key), key); err == nil {
			ops = append(ops, porcupine.Operation{Input: int64(1), Call: 0, Output: true, Return: time.Since(s.started).Nanoseconds()})
		} else if !errors.Is(err, ledger.ErrNotFound) {
			s.t.Fatal(err)
		}
	}
	s.mu.Unlock()
	model := porcupine.Model{
		Init: func() any { return s.total },
		Step: func(state, input, output any) (bool, any) {
			left, q := state.(int64), input.(int64)
			if output.(bool) {
				return left >= q, left - q
			}
			return !strict || left < q, left
		},
	}
	res := porcupine.CheckOperationsTimeout(model, ops, time.Minute)
	s.t.Logf("linearizability (strict=%v) of %d operations: %s", strict, len(ops), res)
	if res != porcupine.Ok {
		s.t.Errorf("history of %d operations is %s against the counter model", len(ops), res)
	}
}

// Counts is how many answers of each status the workers have had.
func (s *FlashSale) Counts() map[int]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int]int, len(s.counts))
	for k, v := range s.counts {
		out[k] = v
	}
	return out
}

// OrderAnswered is the order id the key was answered 201 with, "" if none.
func (s *FlashSale) OrderAnswered(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.orders[key]
}

// Lost stops the workers and returns the keys answered 201 whose order
// the ledger does not have (under the key, with the id answered): sales
// an asynchronous failover dropped. A read error fails the test.
func (s *FlashSale) Lost() []string {
	s.t.Helper()
	s.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	var lost []string
	for key, id := range s.orders {
		o, err := OrderOf(context.Background(), s.envs[0].Ledger, s.buyerOf(key), key)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			lost = append(lost, key)
		case err != nil:
			s.t.Fatal(err)
		case o.ID.String() != id:
			s.t.Errorf("201 for key %s order %s; ledger has %s under it", key, id, o.ID)
		}
	}
	return lost
}
