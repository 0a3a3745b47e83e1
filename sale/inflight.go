package sale

import "sync"

// inflight joins concurrent requests that carry the same idempotency key on
// this replica: the first runs, the others wait and get its answer,
// replayed, so 20 concurrent copies of one request give 20 identical
// bodies and one of them is the request made. Across replicas the
// ledger's unique key does the same job, more slowly.
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
// different body hash waits for the one in flight to end and is then
// decided on its own: the key's record says whether it is a retry of what
// committed (replayed) or a reuse (422). Answering it 422 at once would
// refuse a retry of a committed request just because a reuse of its key
// happened to be in flight beside it.
func (f *inflight) do(key, hash string, fn func() answer) answer {
	for {
		f.mu.Lock()
		if f.calls == nil {
			f.calls = make(map[string]*call)
		}
		c, ok := f.calls[key]
		if !ok {
			break // with f.mu held
		}
		f.mu.Unlock()
		<-c.done
		if c.hash == hash {
			// Another copy made this answer: to this one it is a replay,
			// as to a retry after it or on another replica (a 201 here
			// without the header read as a second request made).
			res := c.res
			res.replayed = true
			return res
		}
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
	return c.res
}
