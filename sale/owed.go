package sale

import (
	"context"
	"errors"
	"sync"

	"github.com/stockgate/stockgate/breaker"
)

// maxOwed bounds the calls a replica keeps for the sweeper, per kind
// (owed): past it, a count stays until it lapses by itself (a buyer's
// quota count when the buyer's hash goes a day without a new count; a
// hold budget count at its hold's expiry plus budgetGrace).
const maxOwed = 10_000

const (
	owedPerSweep     = 500 // calls to Redis a sweep makes for one kind of owed call
	owedSlowPerSweep = 3   // failures other than an open breaker a sweep tolerates, of every kind
)

// owed are gate calls that failed (Redis out of reach, its breaker open)
// and that nothing else repairs in time: the release of a buyer's quota
// count (quotaRelease), the end or extension of a hold budget count
// (budgetCall). Left undone, a buyer who owns or holds nothing is
// refused at a cap or a budget. The sweeper makes them again (retry). A
// replica that stops loses its list; those counts lapse as maxOwed's do.
type owed[T any] struct {
	mu      sync.Mutex
	list    []T
	dropped int
}

func (o *owed[T]) add(c T) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.list) >= maxOwed {
		o.dropped++
		return
	}
	o.list = append(o.list, c)
}

func (o *owed[T]) drain() (list []T, dropped int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	list, dropped, o.list, o.dropped = o.list, o.dropped, nil, 0
	return list, dropped
}

// retry makes the owed calls again with call: up to owedPerSweep calls a
// sweep, and while *slow (the sweep's allowance, shared by every kind)
// lasts, each failure other than at an open breaker (which refuses at
// once) spending one: a master that answers slowly costs up to
// RedisTimeout a call, and the sweep also expires holds. Those that fail
// again wait for the next sweep behind the ones not tried, so a master
// still out holds up no other master's calls.
func (o *owed[T]) retry(ctx context.Context, slow *int, call func(context.Context, T) error) (dropped int) {
	list, dropped := o.drain()
	var failed []T
	calls, i := 0, 0
	for ; i < len(list) && calls < owedPerSweep && *slow > 0 && ctx.Err() == nil; i++ {
		err := call(ctx, list[i])
		if err == nil {
			calls++
			continue
		}
		failed = append(failed, list[i])
		if !errors.Is(err, breaker.ErrOpen) {
			calls++
			*slow--
		}
	}
	for _, c := range list[i:] {
		o.add(c)
	}
	for _, c := range failed {
		o.add(c)
	}
	return dropped
}
