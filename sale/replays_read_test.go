package sale

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// scriptedReads is a ledger whose committed-keys reads are answered in
// turn by reads: each call takes the next, waiting for it to be sent.
type scriptedReads struct {
	Ledger // only CommittedSince is called
	reads  chan func() (ledger.Committed, error)
	began  chan struct{}
}

func (l *scriptedReads) CommittedSince(ctx context.Context, _ stock.SKU, _ int64) (ledger.Committed, error) {
	l.began <- struct{}{}
	select {
	case read := <-l.reads:
		return read()
	case <-ctx.Done():
		return ledger.Committed{}, ctx.Err()
	}
}

// A shared read of a SKU's committed keys that fails is not a read done
// for the callers that waited for it: each reads again (helper-97: a
// read started under a client's context that went away ended the
// door's wait for it, and a retry of a committed purchase was answered
// as a new request: "not committed", no error).
func TestReplaysFailedSharedReadIsReadAgain(t *testing.T) {
	l := &scriptedReads{reads: make(chan func() (ledger.Committed, error)), began: make(chan struct{}, 8)}
	r, err := newReplays(l, time.Minute, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sku := stock.SKU{Program: keys.MustID("p"), Ticket: keys.MustID("t")}
	buyer, key := keys.MustID("ann"), keys.MustID("k1")
	committed := ledger.Committed{Version: 2, Remaining: 5, Keys: []ledger.ScopedKey{{Scope: buyer, Key: key}}}
	type result struct {
		found bool
		err   error
	}
	results := make(chan result, 3)
	ask := func() { // owned by the test: each ends with a scripted read
		found, err := r.committed(context.Background(), sku, buyer, key)
		results <- result{found, err}
	}
	// A's read is in flight; B and C arrive meanwhile, so both wait for
	// a read that begins after it: the one of them that starts it fails.
	go ask()
	<-l.began
	go ask()
	go ask()
	wait.For(t, time.Minute, "two callers waiting for the read in flight", func() bool { return waitingInLookup() == 2 })
	l.reads <- func() (ledger.Committed, error) { return ledger.Committed{Version: 1, Remaining: 5}, nil }
	<-l.began // B's (or C's) read
	l.reads <- func() (ledger.Committed, error) { return ledger.Committed{}, errors.New("its client went away") }
	// Every further read finds the key: the waiter of the failed read
	// reads again.
	var got []result
	for len(got) < 3 {
		select {
		case <-l.began:
			l.reads <- func() (ledger.Committed, error) { return committed, nil }
		case res := <-results:
			got = append(got, res)
		}
	}
	failed, found := 0, 0
	for _, res := range got {
		switch {
		case res.err != nil:
			failed++
		case res.found:
			found++
		}
	}
	// A read before the key committed: not found. Of B and C, the one
	// whose read failed has its error, and the other the key.
	if failed != 1 || found != 1 {
		t.Errorf("answers %+v: want one not found (A), one failed with its read and one that found the key by its own read", got)
	}
}

// waitingInLookup counts the goroutines blocked in replays.lookup's wait
// for a read another caller started.
func waitingInLookup() int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	waiting := 0
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		if strings.Contains(g, "[select") && strings.Contains(g, "(*replays).lookup(") && !strings.Contains(g, "CommittedSince") {
			waiting++
		}
	}
	return waiting
}
