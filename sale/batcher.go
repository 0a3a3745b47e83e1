package sale

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/tracing"
)

// batcher group-commits work: items queue on lanes, and each lane hands
// whatever queued while its previous flush ran (up to max) to one flush.
// Under load the ledger then sees one transaction per batch, not per item,
// and batches grow with what is waiting; a lone item still goes at once,
// alone, and an idle lane costs nothing. Each lane is a goroutine owned by
// the batcher and ended by close.
//
// Items fill the lanes in order (pick): the next lane takes work only
// while every lane before it runs a flush with a full batch already
// waiting behind it, a lane that can't keep up. So a crowd's items go
// through as few lanes, and so as few and as large transactions, as keep
// up with it: spread by SKU over two lanes, 64 buyers of 100 SKUs made
// batches of 13 (docs/BENCHMARKS.md, 2026-12-03).
//
// An item waits for its flush at most about budget when the ledger is
// overloaded: a lane learns how many items a second it commits from its
// full batches (a lane that never fills one is not overloaded), refuses
// at once an item that would wait longer than the budget behind those
// queued (errLedgerBusy, with the wait), and refuses, unflushed, an item
// that waited longer while the queue is still longer than the lane can
// commit within the budget, or while its flushes take longer than it. An overloaded ledger then sheds load with
// answers clients can retry, instead of queueing without bound.
//
// A slow ledger is the other case: a link that adds half a second to each
// round trip never fills a batch, so the pace above is never learned, and
// every item would wait out the slow flush ahead of it and then its own.
// A lane also keeps what its flushes take (a moving average, and the one
// running, once it has run longer): while flushes take longer than the
// budget, an item that would queue behind one is refused at once. An
// idle lane takes any item: those are what measure the ledger again, so
// the lane opens by itself once the ledger is fast again.
type batcher[T, R any] struct {
	max     int
	timeout time.Duration
	budget  time.Duration // 0: no bound
	metrics laneMetrics
	// flush decides items and calls answer once for each index, as soon
	// as that item's outcome is known.
	flush func(ctx context.Context, items []T, answer func(i int, r R))
	lanes []*lane[T, R]
	// resent is when an item was last sent again (withinDeadline; Unix
	// ns, 0: never): the ledger was without a primary, and the backlog
	// its gap left is waited out, not shed (see patient).
	resent atomic.Int64
	stop   chan struct{}
	wg     sync.WaitGroup
	// mu orders do's enqueue against close: once closed is set, no item is
	// queued where no lane will take it.
	mu     sync.RWMutex
	closed bool
	// The spans' names: a request's wait and commit, and a batch's.
	commitSpan, batchSpan string
}

// laneMetrics is what a batcher reports: how long items waited for their
// flush, and how many it refused. Either may be nil.
type laneMetrics struct {
	name string // the work, as the metrics' label and the batch span's name say it
	wait interface{ Observe(float64) }
	shed *prometheus.CounterVec // by where the item was refused (the shed* labels)
}

func (m laneMetrics) waited(d time.Duration) {
	if m.wait != nil {
		m.wait.Observe(d.Seconds())
	}
}

// Where a batcher refused an item, as stockgate_ledger_shed_total's at
// label says it: which check turned a request away is what tells a slow
// ledger from a failover's stall from a full queue (the planned
// failover's 503s could only be inferred from the code before).
const (
	shedDoor        = "door"         // on arrival: the queue ahead would take past the budget (over)
	shedDoorPatient = "door_patient" // as door, within a timeout of a re-send: past half its time (waitsOut)
	shedFull        = "full"         // on arrival: the lane's queue had no room
	shedWithdrawn   = "withdrawn"    // while queued: its request's deadline came first
	shedFlush       = "flush"        // at its batch's start: waited past the budget behind a slow lane, or too late
	shedBehind      = "behind"       // while queued behind a flush running past the budget (shedBehind)
)

func shedDoorAt(patient bool) string {
	if patient {
		return shedDoorPatient
	}
	return shedDoor
}

func (m laneMetrics) refused(at string) {
	if m.shed != nil {
		m.shed.WithLabelValues(at).Inc()
	}
}

// lane is one queue of a batcher and what it learned of its pace.
type lane[T, R any] struct {
	q      chan *pendingItem[T, R]
	queued atomic.Int64
	// rate is the items a second this lane committed while busy (a flush
	// with more waiting behind it), a moving average; 0 until known.
	rate atomic.Uint64 // float64 bits
	// busySince is when the running flush began (Unix ns; 0 while the
	// lane waits for work), and flushTime what its flushes take, a
	// moving average in seconds (float64 bits; 0 until the first).
	busySince atomic.Int64
	flushTime atomic.Uint64
	// timedOut: the lane's last batch ran out of time (a silent or cut
	// ledger link, a hung server). Its next batch ends at its items'
	// earliest deadline, so none is answered past its request's work
	// timeout while the ledger hangs. Only the lane's goroutine uses it.
	timedOut bool
}

type pendingItem[T, R any] struct {
	item     T
	at       time.Time
	deadline time.Time // the request's (zero: none)
	strict   bool      // sent again: its batch ends by its deadline (withinDeadline)
	patient  bool      // waits out a failover's backlog (see patient)
	out      chan outcome[R]
	link     trace.SpanContext // the request's span, which the batch's links to (zero: tracing off)
	// state: queued until a lane takes it (to flush or refuse) or its
	// request withdraws it at its deadline (see wait); whoever changes it
	// first decides the item.
	state atomic.Int32
}

// pendingItem states.
const (
	itemQueued int32 = iota
	itemTaken
	itemWithdrawn
)

// take claims p for its lane, false when its request withdrew it (it is
// only dropped from the queue).
func (p *pendingItem[T, R]) take() bool {
	return p.state.CompareAndSwap(itemQueued, itemTaken)
}

type outcome[R any] struct {
	r     R
	err   error
	batch trace.SpanContext // the span of the batch that decided it (zero: tracing off)
}

// errClosing refuses work after close: nothing was done.
var errClosing = fmt.Errorf("sale: shutting down: %w", ledger.ErrNotCommitted)

// busyError refuses an item the ledger could not take within the wait
// budget; nothing was done. Wait is when to ask again.
type busyError struct{ wait time.Duration }

func (e *busyError) Error() string {
	return fmt.Sprintf("sale: the ledger is at its capacity; retry in %v", e.wait.Round(time.Millisecond))
}

func (e *busyError) Unwrap() error { return ledger.ErrNotCommitted }

// errLedgerBusy is matched by errors.Is on every *busyError.
var errLedgerBusy = &busyError{}

func (e *busyError) Is(target error) bool { return target == errLedgerBusy }

// busyWait is the wait a busyError in err's chain asks for (0: none).
func busyWait(err error) time.Duration {
	var b *busyError
	if errors.As(err, &b) {
		return b.wait
	}
	return 0
}

// answerMargin is the time before its deadline at which an item still
// queued is withdrawn: left for its request's give-back and answer, a few
// milliseconds while Redis answers.
const answerMargin = 100 * time.Millisecond

// laneRoom is how many batches a lane's queue holds.
const laneRoom = 16

func newBatcher[T, R any](lanes, max int, timeout, budget time.Duration, m laneMetrics,
	flush func(ctx context.Context, items []T, answer func(i int, r R))) *batcher[T, R] {
	b := &batcher[T, R]{max: max, timeout: timeout, budget: budget, metrics: m, flush: flush, stop: make(chan struct{}),
		commitSpan: "ledger.commit " + m.name, batchSpan: "ledger.batch " + m.name}
	for range lanes {
		// The pace (over) bounds the queue to a budget's worth; the room
		// beyond it is for a failover's backlog (patient): at 1,677 a
		// second, two lanes of 4 batches refused 575 new arrivals behind
		// the re-sends of a 2 s gap (stockbench faults).
		l := &lane[T, R]{q: make(chan *pendingItem[T, R], laneRoom*max)}
		b.lanes = append(b.lanes, l)
		b.wg.Go(func() { b.run(l) })
	}
	return b
}

// do queues item on the first lane that keeps up and waits for its
// answer. It returns errClosing once the batcher is closed and a
// *busyError when the item would wait, or waited, past the budget;
// either way nothing was done.
func (b *batcher[T, R]) do(ctx context.Context, item T) (R, error) {
	if !tracing.Enabled() {
		r, _, err := b.wait(ctx, item)
		return r, err
	}
	// The request's own span of its wait and commit, which the batch that
	// commits it links to, and which links back to that batch's span.
	ctx, span := tracing.Start(ctx, b.commitSpan)
	r, batch, err := b.wait(ctx, item)
	tracing.AddLink(span, batch)
	tracing.End(span, err)
	return r, err
}

// wait is do's work: it also returns the span of the batch that decided
// item (zero when tracing is off or no batch did).
func (b *batcher[T, R]) wait(ctx context.Context, item T) (R, trace.SpanContext, error) {
	l := b.pick()
	var zero R
	var none trace.SpanContext
	p := &pendingItem[T, R]{item: item, at: time.Now(), out: make(chan outcome[R], 1), link: tracing.Link(ctx)}
	p.deadline, _ = ctx.Deadline()
	p.strict = ctx.Value(strictKey{}) != nil
	p.patient = b.patient(p)
	wait, over := b.over(l)
	if over && p.patient && !p.strict && b.stalled(l) {
		// A failover's stall is not a slow ledger: once a primary takes
		// writes again its backlog drains at the lane's pace, so a
		// patient item is judged by that pace, not by the stalled flush
		// (slow multiplies a flush stalled a second by the batches
		// queued behind it: 1,534 arrivals refused in a planned
		// failover's second second, stockbench faults -goroutines).
		wait, over = b.overloaded(l, l.queued.Load()+1)
	}
	if over && !b.waitsOut(p, wait) {
		b.metrics.refused(shedDoorAt(p.patient))
		return zero, none, &busyError{wait: wait}
	}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return zero, none, errClosing
	}
	if !b.enqueue(ctx, l, p) {
		b.mu.RUnlock()
		b.metrics.refused(shedFull)
		return zero, none, &busyError{wait: b.budget}
	}
	l.queued.Add(1)
	b.mu.RUnlock()
	var expire <-chan time.Time
	// One queued with less than the margin left waits for its deadline:
	// an idle lane may yet flush it (helper-89 #4).
	if d := time.Until(p.deadline) - answerMargin; !p.deadline.IsZero() && d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		expire = t.C
	}
	select {
	case o := <-p.out:
		return o.r, o.batch, o.err
	case <-expire:
	case <-ctx.Done():
	}
	// Out of time while queued behind a flush that runs past its deadline
	// (a failover's connect attempts took 2 s each, and the items queued
	// behind them were answered 503 up to 1.1 s past their work timeout,
	// stockbench faults, node lost): withdrawn, nothing was done, and its
	// request has answerMargin to give its stock back and answer. Taken
	// already, its batch ends by its deadline (patient) or has the
	// timeout (flushAll).
	if p.state.CompareAndSwap(itemQueued, itemWithdrawn) {
		b.metrics.refused(shedWithdrawn)
		return zero, none, &busyError{wait: time.Since(p.at)}
	}
	o := <-p.out
	return o.r, o.batch, o.err
}

// enqueue puts p on l's queue (b.mu read-held), false when it is full.
// An item sent again waits for room until its request's deadline: the
// lane drains its queue even while closing, so the wait ends.
func (b *batcher[T, R]) enqueue(ctx context.Context, l *lane[T, R], p *pendingItem[T, R]) bool {
	select {
	case l.q <- p:
		return true
	default:
		if !p.strict {
			return false
		}
	}
	// Not past the time its batch would need (tooLate), less the
	// answer's margin its batch ends by (answerBy).
	wait := time.NewTimer(time.Until(p.deadline) - b.budget - answerMargin)
	defer wait.Stop()
	select {
	case l.q <- p:
		return true
	case <-ctx.Done():
		return false
	case <-wait.C:
		return false
	}
}

// pick returns the first lane that keeps up: one that is idle (nothing
// running, nothing queued), or whose next batch is not full yet and would
// not make one more item wait past the budget at its pace (overloaded);
// the last lane when none does. A lane that can't take an item within the
// budget thus opens the next one rather than refusing it while that one
// idles. (A lane between two flushes has no flush running but may have a
// queue: it is judged by its queue, not taken for idle.)
//
// A slow ledger is the exception: a lane whose flushes run past the
// budget is returned, and refuses the item (wait). The link is the same
// for every lane, so the next one would take items only to make each wait
// out a slow flush in turn: opening lanes for it put 45 to 67 requests of
// 24 clients past the budget at the fault's onset
// (TestFaultLedgerSlowShedsAtOnce), one lane's worth per lane.
func (b *batcher[T, R]) pick() *lane[T, R] {
	last := len(b.lanes) - 1
	now := time.Now()
	for _, l := range b.lanes[:last] {
		queued := l.queued.Load()
		if l.busySince.Load() == 0 && queued <= 0 {
			return l
		}
		if _, slow := b.slow(l, queued+1, now); slow {
			return l
		}
		if _, over := b.overloaded(l, queued+1); queued < int64(b.max) && !over {
			return l
		}
	}
	return b.lanes[last]
}

// over reports whether one more item on l would wait past the budget,
// and how long the queue ahead of it would take.
func (b *batcher[T, R]) over(l *lane[T, R]) (time.Duration, bool) {
	n := l.queued.Load() + 1
	// An idle lane flushes the item at once: it waits for nothing, so
	// the pace refuses nothing. The pace is learned from full batches
	// only, and a lane whose last ones were slow (a stalled machine)
	// refused every item after them, alone, for as long as it never saw
	// another full batch: once the storm had passed, forever
	// (TestOverloadShedsAtTheLedger in a loaded make test: every retry
	// of a shed purchase refused for 30 s).
	//
	// Nor does a lane finishing a flush with nothing queued: it answers
	// its items before it marks itself idle, so a client's next item can
	// arrive in between (TestBatcherIdleLaneTakesAnItemWhateverItsPace in
	// a loaded make test). Such an item waits for the rest of the running
	// flush and its own, which slow judges; a stale pace does not.
	if n == 1 {
		return b.slow(l, n, time.Now())
	}
	if wait, over := b.overloaded(l, n); over {
		return wait, true
	}
	return b.slow(l, n, time.Now())
}

// slow reports whether the ledger is slower than the budget: l's flushes
// take longer than it (an item queued now would wait for the rest of the
// running one, one per max items ahead of it, and its own, which it
// returns). A busy ledger whose flushes fit the budget is the pace's to
// judge (overloaded): shedding behind every long flush turned away, on a
// loaded machine, confirms and drained requests a healthy ledger would
// have committed. An idle lane is never slow.
func (b *batcher[T, R]) slow(l *lane[T, R], n int64, now time.Time) (time.Duration, bool) {
	since := l.busySince.Load()
	if b.budget <= 0 || since == 0 {
		return 0, false
	}
	ran := now.Sub(time.Unix(0, since))
	// A flush that has run longer than the average says the ledger is
	// slower now than it was: the next ones are taken to be as slow.
	per := max(time.Duration(math.Float64frombits(l.flushTime.Load())*float64(time.Second)), ran)
	wait := per - ran + time.Duration((n-1)/int64(b.max)+1)*per
	return wait, per > b.budget
}

// stalled reports whether only l's running flush is past the budget: its
// finished flushes kept to it and it has a pace. That is a failover's
// stall (a COMMIT waiting on a standby that went away, a primary being
// replaced); a slow ledger's finished flushes are slow too, and a lane
// with no pace yet (a replica started mid-failover) has none to judge by.
func (b *batcher[T, R]) stalled(l *lane[T, R]) bool {
	flush := time.Duration(math.Float64frombits(l.flushTime.Load()) * float64(time.Second))
	return math.Float64frombits(l.rate.Load()) > 0 && flush <= b.budget
}

// overloaded reports whether committing n items takes l longer than the
// budget at its learned pace, and how long.
func (b *batcher[T, R]) overloaded(l *lane[T, R], n int64) (time.Duration, bool) {
	rate := math.Float64frombits(l.rate.Load())
	if b.budget <= 0 || rate <= 0 {
		return 0, false
	}
	wait := time.Duration(float64(n) / rate * float64(time.Second))
	return wait, wait > b.budget
}

func (b *batcher[T, R]) run(l *lane[T, R]) {
	for {
		var first *pendingItem[T, R]
		select {
		case first = <-l.q:
		case <-b.stop:
			for { // answer whatever is still queued before leaving
				select {
				case p := <-l.q:
					l.queued.Add(-1)
					b.flushAll(l, []*pendingItem[T, R]{p})
				default:
					return
				}
			}
		}
		batch := []*pendingItem[T, R]{first}
	drain:
		for len(batch) < b.max {
			select {
			case p := <-l.q:
				batch = append(batch, p)
			default:
				break drain
			}
		}
		l.queued.Add(-int64(len(batch)))
		b.flushAll(l, batch)
	}
}

// flushAll flushes batch, less the items that waited past the budget
// (refused unflushed), and learns the lane's pace from it.
func (b *batcher[T, R]) flushAll(l *lane[T, R], batch []*pendingItem[T, R]) {
	start := time.Now()
	full := len(batch) == b.max
	_, behind := b.overloaded(l, int64(len(batch))+l.queued.Load())
	// A lane whose flushes take longer than the budget (a slow ledger)
	// refuses what queued past it too: the items that queued at the
	// onset, before the first slow flush had run past the budget, would
	// otherwise each wait out a slow flush in turn (stockbench faults,
	// PostgreSQL 500 ms slower: seconds at the p99).
	slow := b.budget > 0 && time.Duration(math.Float64frombits(l.flushTime.Load())*float64(time.Second)) > b.budget
	fresh := batch[:0]
	end := start.Add(b.timeout)
	patient := b.patientAt(start)
	for _, p := range batch {
		if !p.take() {
			continue // withdrawn: its request answered itself
		}
		// An item that queued before a failover's first re-send is part
		// of the gap's backlog too: it arrived while the stall began,
		// before any take knew no server took writes, and shed by the
		// budget now it was 503 once the primary was back (814-1,280 of a
		// planned failover's 1,700 a second in its first second,
		// stockbench faults).
		p.patient = p.patient || patient
		waited := start.Sub(p.at)
		b.metrics.waited(waited)
		// Refused unflushed (nothing moved; the caller gives its stock
		// back): one that waited past the budget behind a lane that
		// can't keep up or a slow one (unless patient),
		// and one whose request ran out of time waiting.
		if (behind || slow) && waited > b.budget && !p.patient || !p.deadline.IsZero() && !start.Before(p.deadline) || b.tooLate(l, p, start) {
			b.metrics.refused(shedFlush)
			p.out <- outcome[R]{err: &busyError{wait: waited}}
			continue
		}
		// A patient item may have waited most of its time in the queue:
		// its batch ends by its deadline too (tooLate left it the time
		// for one), or it was answered up to a whole timeout past it.
		// Ended by the deadline itself, its give-back and answer came
		// after it.
		if (l.timedOut || p.patient) && !p.deadline.IsZero() {
			end = earlier(end, answerBy(p.deadline, start))
		}
		// Nor does a healthy batch outlast a timeout of a request's item
		// from when it queued: one that hung (the ledger's link
		// black-holed) answered what had queued behind the flush before
		// it that much past their work timeout (3 of 23,860 past 5 s,
		// stockbench faults). An item with no request's deadline (a
		// sweeper's) bounds nothing: it may have waited longer than a
		// timeout, and would cut its batch at once.
		if due := p.at.Add(b.timeout); !p.deadline.IsZero() && due.After(start) {
			end = earlier(end, answerBy(due, start))
		}
		fresh = append(fresh, p)
	}
	batch = fresh
	if len(batch) == 0 {
		return
	}
	// A healthy batch has a whole timeout from its oldest request's
	// queueing, however short its items' time left: a slow one (SQLite
	// on a busy machine) still commits.
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	defer func() { l.timedOut = ctx.Err() != nil }()
	items := make([]T, len(batch))
	for i, p := range batch {
		items[i] = p.item
	}
	if tracing.Enabled() {
		// The batch is a trace of its own, linked to each request it
		// carries (a span has one parent, a batch many requesters).
		links := make([]trace.SpanContext, len(batch))
		for i, p := range batch {
			links[i] = p.link
		}
		var span trace.Span
		ctx, span = tracing.StartLinked(ctx, b.batchSpan, links, attribute.Int("stockgate.batch.size", len(batch)))
		defer span.End()
	}
	bsc := tracing.Link(ctx) // zero when off
	l.busySince.Store(start.UnixNano())
	var watch *time.Timer
	if b.budget > 0 {
		since := start.UnixNano()
		watch = time.AfterFunc(b.budget, func() { b.shedBehind(l, since) })
	}
	b.flush(ctx, items, func(i int, r R) { batch[i].out <- outcome[R]{r: r, batch: bsc} })
	if watch != nil {
		watch.Stop()
	}
	l.busySince.Store(0)
	b.learn(l, time.Since(start), len(batch), full)
}

// learnFlush is a lane's flush time after a flush that took took, its
// average old (0: none yet). A flush past twice the budget is a slow
// ledger, taken at its word at once: averaged in with the fast flushes
// before it (a fifth of 1.1 s beside 15 ms is 232 ms, under the 250 ms
// budget), the lane was not slow for one more flush, and a second wave of
// requests queued past the budget at the fault's onset (44 of 24
// clients in a loaded make test, TestFaultLedgerSlowShedsAtOnce). A flush
// merely long on a loaded machine (well under twice the budget) is
// averaged in as before, so it sheds nothing by itself. (A failover's
// stall is not learned at all: see learn.)
func (b *batcher[T, R]) learnFlush(old float64, took time.Duration) float64 {
	t := took.Seconds()
	switch {
	case old <= 0:
		return t
	case b.budget > 0 && took > 2*b.budget:
		return max(t, 0.8*old+0.2*t)
	}
	return 0.8*old + 0.2*t
}

// shedBehind answers busy, while the flush that began at since (Unix ns)
// runs past the budget, each item queued behind it as soon as it has
// waited the budget, as flushAll would when that flush ended: a slow
// ledger's 500 ms round trips made a flush take 2 s, and a black-holed
// link the whole work timeout, so the items that queued in its first
// budget (before the door saw it was slow) were answered 503 after 2.2 s
// and 5.2 s at the p99 (stockbench faults) where the budget is 250 ms.
// It runs on the flush's timer and stops when the flush ends.
func (b *batcher[T, R]) shedBehind(l *lane[T, R], since int64) {
	tick := max(b.budget/10, time.Millisecond)
	for l.busySince.Load() == since {
		now := time.Now()
		if b.patientAt(now) {
			// Waiting out a failover's backlog: its items are not shed
			// here, and the drain below, which assumes the door lets
			// nothing in meanwhile, would let blocked re-sends and new
			// patient items jump the queue and refuse the older ones
			// when they found it full again. flushAll sheds the rest.
			time.Sleep(tick)
			continue
		}
		var young []*pendingItem[T, R]
	drain:
		for {
			select {
			case p := <-l.q:
				if p.state.Load() == itemWithdrawn {
					l.queued.Add(-1) // its request answered itself
					continue
				}
				if waited := now.Sub(p.at); waited > b.budget && !p.patient && p.take() {
					l.queued.Add(-1)
					b.metrics.waited(waited)
					b.metrics.refused(shedBehind)
					p.out <- outcome[R]{err: &busyError{wait: waited}}
				} else {
					young = append(young, p)
				}
			default:
				break drain
			}
		}
		// The door refuses new items while a flush runs past the budget
		// (slow), so the young go back in their order; a queue that
		// filled meanwhile refuses them. Under the lock the door takes,
		// so that a close, whose lane drains its queue as it stops, sees
		// them there.
		b.mu.RLock()
		for _, p := range young {
			if b.closed {
				l.queued.Add(-1)
				if p.take() {
					p.out <- outcome[R]{err: errClosing}
				}
				continue
			}
			select {
			case l.q <- p:
			default:
				l.queued.Add(-1)
				if p.take() {
					b.metrics.refused(shedFull)
					p.out <- outcome[R]{err: &busyError{wait: b.budget}}
				}
			}
		}
		b.mu.RUnlock()
		time.Sleep(tick)
	}
}

// close stops the lanes once they have answered what was queued; do
// after it returns errClosing. A second close does nothing.
func (b *batcher[T, R]) close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	b.mu.Unlock()
	close(b.stop)
	b.wg.Wait()
}

// aloneLimit bounds how many items split out of one batch are decided
// alone at once.
const aloneLimit = 16

// eachAlone runs decide for each index, at most aloneLimit at a time, and
// returns when all have run: the items a batch could not decide together.
func eachAlone(idx []int, decide func(i int)) {
	sem := make(chan struct{}, aloneLimit)
	var wg sync.WaitGroup
	for _, i := range idx {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			decide(i)
		})
	}
	wg.Wait()
}
