package sale

import (
	"context"
	"math"
	"time"
)

// A batcher's deadlines: which items wait out a failover's backlog rather
// than being shed by the budget (patient), and when a batch must end for
// its items to be answered within their requests' time.

// patient reports whether p waits out a queue past the budget rather
// than being shed by it: an item sent again (awaitPrimary), let in
// already and waiting for a primary since, and any item within a work
// timeout of one. A failover's gap leaves a backlog: at its end, every
// take that waited is sent again at once, and the lane drains them at
// its capacity less the new arrivals, about as long as the gap at half
// capacity. Shed by the budget meanwhile, the new arrivals behind that
// backlog were answered 503 (2,681 of 88,668 at 1,673 a second,
// stockbench faults, a planned failover). The budget is for a ledger
// slower than its load; a backlog that drains by itself is waited for,
// up to half the item's time (waitsOut), and sheds as before a work
// timeout after the last re-send.
func (b *batcher[T, R]) patient(p *pendingItem[T, R]) bool {
	if p.strict {
		b.resent.Store(p.at.UnixNano())
		return true
	}
	return b.patientAt(p.at)
}

// resending marks the lanes patient from now: a flush found no primary,
// and its takes will be sent again (resendWithoutPrimary). Marked by the
// flush itself, before its time is learned (learn): the first flush
// to end a failover's stall ends before any of its takes is sent again,
// and learned at its word its stall made the lane slow for the door
// (stalled no longer held) while the backlog behind it drained.
func (b *batcher[T, R]) resending() { b.resent.Store(time.Now().UnixNano()) }

// patientAt reports whether t is within a timeout of the last re-send.
func (b *batcher[T, R]) patientAt(t time.Time) bool {
	last := b.resent.Load()
	return last != 0 && t.Sub(time.Unix(0, last)) < b.timeout
}

// tooLate reports whether a patient item has too little time left at
// start to be flushed: under the budget, or under two of l's flushes.
// Its batch ends by its deadline (strict) or would be cut by it, and a
// patient item can have waited most of its time: flushed with
// milliseconds left, it cut its whole batch short, up to a lane of
// healthy takes answered 503 (some with their COMMIT's outcome unknown),
// and the next batch, ending at its own earliest deadline, the same.
// Refused unflushed instead, nothing moved.
func (b *batcher[T, R]) tooLate(l *lane[T, R], p *pendingItem[T, R], start time.Time) bool {
	if !p.patient || p.deadline.IsZero() {
		return false
	}
	flush := time.Duration(math.Float64frombits(l.flushTime.Load()) * float64(time.Second))
	// The batch ends answerMargin before the deadline (answerBy).
	return answerBy(p.deadline, start).Sub(start) < max(b.budget, 2*flush)
}

// waitsOut reports whether p waits for a queue that takes wait to commit
// at the lane's pace: one sent again always (its request's deadline still
// bounds it), a patient one while that is under half the time its
// request has left.
func (b *batcher[T, R]) waitsOut(p *pendingItem[T, R], wait time.Duration) bool {
	switch {
	case p.strict:
		return true
	case !p.patient:
		return false
	case p.deadline.IsZero():
		return wait < b.timeout/2
	}
	return wait < p.deadline.Sub(p.at)/2
}

// withinDeadline marks ctx's items as sent again (awaitPrimary): their
// batch must end by their deadline, where a batch has the whole timeout
// otherwise (one sent late in its request's time would else be answered
// up to a whole timeout past its deadline), and the budget does not shed
// them (see patient).
func withinDeadline(ctx context.Context) context.Context {
	return context.WithValue(ctx, strictKey{}, true)
}

type strictKey struct{}

// answerBy is when a flush that began at start must end for an item due
// at deadline to be answered in time: answerMargin before it, or half the
// time left if that is less.
func answerBy(deadline, start time.Time) time.Time {
	return deadline.Add(-min(answerMargin, deadline.Sub(start)/2))
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// learn records what a flush of n items that took took says of l's
// ledger: its flush time (learnFlush), and its pace if the batch was full
// (the lane committed as fast as it could).
func (b *batcher[T, R]) learn(l *lane[T, R], took time.Duration, n int, full bool) {
	if b.budget > 0 && took > 2*b.budget && b.patientAt(time.Now()) {
		// A failover's stall: a flush that ran past twice the budget
		// while takes were sent again for want of a primary measures the
		// gap, not the ledger. Learned, even averaged in, it makes the
		// lane read slow or its pace a few hundred a second, so the door
		// can refuse patient arrivals behind a backlog that drains at the
		// lane's real pace (a planned failover's 503s were all such
		// refusals, door_patient, stockbench faults). A new primary that
		// is slow is learned once the re-sends have stopped a timeout.
		return
	}
	l.flushTime.Store(math.Float64bits(b.learnFlush(math.Float64frombits(l.flushTime.Load()), took)))
	if full {
		// A full batch: the lane commits as fast as it can. Its pace is
		// the lane's capacity.
		pace := float64(n) / max(took.Seconds(), 1e-6)
		old := math.Float64frombits(l.rate.Load())
		if old > 0 {
			pace = 0.8*old + 0.2*pace
		}
		l.rate.Store(math.Float64bits(pace))
	}
}
