package sale

import "sync"

// inflight joins concurrent requests that carry the same idempotency key on
// this replica: the first runs, the others wait and get its answer, so 20
// concurrent copies of one request give 20 identical answers. Across
// replicas the ledger's unique key does the same job, more slowly.
type inflight struct {
	mu    sync.Mutex
	calls map[string]*call
}

type call struct {
	hash string
	done chan struct{}
	res  answer
}

// do runs f once per key at a time. A request with the same key but a
// different body hash does not wait: it gets mismatch = true at once.
func (f *inflight) do(key, hash string, fn func() answer) (res answer, mismatch bool) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = make(map[string]*call)
	}
	if c, ok := f.calls[key]; ok {
		f.mu.Unlock()
		if c.hash != hash {
			return answer{}, true
		}
		<-c.done
		return c.res, false
	}
	c := &call{hash: hash, done: make(chan struct{})}
	f.calls[key] = c
	f.mu.Unlock()

	defer func() {
		f.mu.Lock()
		delete(f.calls, key)
		f.mu.Unlock()
		close(c.done)
	}()
	c.res = fn()
	return c.res, false
}
