package fleet

import (
	"context"
	"sync"

	"github.com/stockgate/stockgate/ledger"
)

// Health is one primary's state: whether it takes writes and what its
// commits survive (ledger.Health).
type Health struct {
	Primary    string
	Err        error // nil: it takes writes
	Durability ledger.Durability
}

// Health asks every primary at once; each answer is bounded by ctx.
func (f *Fleet) Health(ctx context.Context) []Health {
	out := make([]Health, len(f.ps))
	var wg sync.WaitGroup
	for i, p := range f.ps {
		wg.Go(func() {
			d, err := p.l.Health(ctx)
			out[i] = Health{Primary: p.name, Err: err, Durability: d}
		})
	}
	wg.Wait()
	return out
}
