package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"sync"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// What a fault run's answers said: why each 503 was answered, and which
// orders its 201s named, audited against the ledger.

// causes counts why each 503 was answered (its problem's type and the
// start of its detail), for the run's stderr: a fault's 503s have
// several causes.
type causes struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *causes) collect(code int, body []byte) {
	if code != http.StatusServiceUnavailable {
		return
	}
	var p struct{ Type, Detail string }
	_ = json.Unmarshal(body, &p) // a body that is no problem counts under ""
	k := path.Base(p.Type) + ": " + p.Detail[:min(len(p.Detail), 48)]
	c.mu.Lock()
	c.n[k]++
	c.mu.Unlock()
}

func (c *causes) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.n)
}

// audit looks the orders of the run's 201s up in the ledger: row.lost
// counts those it does not have, and the 201s that named none.
func (row *faultRow) audit(ctx context.Context, led *ledger.Ledger, answered *sales) error {
	lost, err := answered.audit(ctx, led)
	if err != nil {
		return err
	}
	if lost > 0 || answered.bad > 0 {
		fmt.Fprintf(os.Stderr, "%s: %d of %d 201s name an order the ledger does not have (%d named none, or one twice)\n",
			row.name, lost, len(answered.ids), answered.bad)
	}
	row.lost = lost + answered.bad
	return nil
}

// sales are the orders the run's 201s named, audited one by one against
// the ledger once it is over: totals alone would let a lost sale and a
// commit answered 503 cancel out.
type sales struct {
	mu  sync.Mutex
	ids map[string]struct{}
	bad int // 201s that named no order, or one named before
}

func (s *sales) collect(code int, body []byte) {
	if code != http.StatusCreated {
		return
	}
	var o struct {
		ID string `json:"order_id"`
	}
	_ = json.Unmarshal(body, &o) // a body that names no order counts as bad
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, seen := s.ids[o.ID]; seen || o.ID == "" {
		s.bad++
		return
	}
	s.ids[o.ID] = struct{}{}
}

// audit counts the orders the 201s named that the ledger does not have,
// or has refunded (nothing refunds them here).
func (s *sales) audit(ctx context.Context, led *ledger.Ledger) (lost int, err error) {
	ids := make(chan string)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for id := range ids {
				var o ledger.Order
				k, rerr := keys.ParseID(id)
				if rerr == nil {
					o, rerr = led.OrderByID(ctx, k)
				}
				mu.Lock()
				switch {
				case errors.Is(rerr, ledger.ErrNotFound) || errors.Is(rerr, keys.ErrInvalidID) || rerr == nil && !o.RefundedAt.IsZero():
					lost++
				case rerr != nil && err == nil:
					err = rerr
				}
				mu.Unlock()
			}
		})
	}
	for id := range s.ids {
		ids <- id
	}
	close(ids)
	wg.Wait()
	return lost, err
}
