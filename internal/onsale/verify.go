package onsale

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stockgate/stockgate/client"
)

// What a run checks once the buyers are done: the ledger against every
// answer the buyers were given, and the platform's webhooks heard.

// verify fills in the report's outcome and checks every promise.
func (r *runner) verify(ctx context.Context, rep *Report) {
	t := r.tally(rep)
	// The last sale is a moment ago at most (every buyer has finished):
	// check everyone who did not buy once a refresh has passed since it.
	time.Sleep(time.Until(t.lastSale.Add(r.o.Refresh)))
	r.sweep(ctx, rep, t.lastSale)
	r.checkLedger(ctx, rep, t)
	r.checkOrder(rep)
	r.checkSoldOut(rep, t.lastSale)
	r.mu.Lock()
	rep.Violations = slices.Clone(r.bad)
	r.mu.Unlock()
}

// tallied is what verify learns from the buyers' own records.
type tallied struct {
	lastSale, firstAdmit time.Time
	lateUnseen           int64 // admitted, but back only once it had expired
}

// tally counts the buyers' outcomes into rep, and checks each finished
// and no place went to two.
func (r *runner) tally(rep *Report) tallied {
	var t tallied
	positions := map[int64]int{}
	for i := range r.buyers {
		b := &r.buyers[i]
		positions[b.position]++
		if !b.done {
			r.violate("buyer %d never finished", i)
		}
		if !b.firstAdmitted.IsZero() {
			rep.SeenAdmitted++
			if t.firstAdmit.IsZero() || b.firstAdmitted.Before(t.firstAdmit) {
				t.firstAdmit = b.firstAdmitted
			}
		}
		rep.Walked += b2i(b.walked)
		rep.Refused += b2i(b.refused)
		if b.expired {
			rep.Late++
			t.lateUnseen += b2i(b.firstAdmitted.IsZero())
		}
		if !b.boughtAt.IsZero() {
			rep.Sold++
			if b.boughtAt.After(t.lastSale) {
				t.lastSale = b.boughtAt
			}
		}
	}
	for p, n := range positions {
		if n > 1 {
			r.violate("position %d given to %d buyers", p, n)
		}
	}
	return t
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// sweep asks every buyer who did not buy for its place, on o.Workers
// connections: each must be told sold-out.
func (r *runner) sweep(ctx context.Context, rep *Report, lastSale time.Time) {
	o := r.o
	sweepStart := time.Now()
	var sweep sync.WaitGroup
	next := make(chan int)
	for range o.Workers {
		sweep.Go(func() { // owned by sweep: it waits for them
			for i := range next {
				b := &r.buyers[i]
				st, ok := r.call(ctx, http.MethodGet, b.url+"/v1/programs/"+o.Program+"/queue/"+b.ticket, "", "", "", &r.pollLat)
				if ok && st.State != "sold-out" {
					r.violate("buyer %d (position %d) checked %v after the last sale: %s", i, b.position, time.Since(lastSale), st.State)
				}
			}
		})
	}
	for i := range r.buyers {
		if r.buyers[i].boughtAt.IsZero() {
			rep.Swept++
			next <- i
		}
	}
	close(next)
	sweep.Wait()
	rep.SweepTime = time.Since(sweepStart)
}

// checkLedger holds the room's counter and the ledger to the answers:
// every ticket sold once, every 201 in the ledger, and nobody admitted
// past the stock's slack.
func (r *runner) checkLedger(ctx context.Context, rep *Report, t tallied) {
	o := r.o
	q, err := o.Admin.GetQueue(ctx, o.Program)
	if err != nil {
		r.violate("get queue: %v", err)
	}
	st, err := o.Admin.SKUState(ctx, client.SKU{Program: o.Program, Ticket: "ga"})
	if err != nil {
		r.violate("sku state: %v", err)
	}
	rep.Admitted, rep.LedgerSold = q.Serving, st.Sold
	rep.Unseen = max(rep.Admitted-rep.SeenAdmitted-t.lateUnseen, 0) // each admitted buyer counted once
	if !t.firstAdmit.IsZero() && !t.lastSale.IsZero() {
		rep.SaleTime = t.lastSale.Sub(t.firstAdmit)
	}
	if st.Sold != int64(o.Tickets) || rep.Sold != st.Sold || st.Sold+st.Held > st.Total {
		r.violate("sold %d (ledger %d, held %d) of %d tickets", rep.Sold, st.Sold, st.Held, o.Tickets)
	}
	// Whoever was admitted bought, walked away, never saw it, or found it
	// sold out, and the last are at most the slack.
	if rep.Refused > rep.Slack || rep.Admitted > rep.Sold+rep.Walked+rep.Late+rep.Unseen+rep.Slack {
		r.violate("admitted %d: sold %d + walked %d + late %d + unseen %d + slack %d (refused %d)", rep.Admitted, rep.Sold, rep.Walked,
			rep.Late, rep.Unseen, rep.Slack, rep.Refused)
	}
}

// checkOrder checks, in position order, that no place past the counter
// was admitted, and no buyer was still told waiting a refresh after a
// later place was admitted.
func (r *runner) checkOrder(rep *Report) {
	order := make([]*buyer, 0, len(r.buyers))
	for i := range r.buyers {
		order = append(order, &r.buyers[i])
	}
	slices.SortFunc(order, func(a, b *buyer) int { return int(a.position - b.position) })
	var latestWaiting time.Time // over the places before
	for _, b := range order {
		if !b.firstAdmitted.IsZero() {
			if b.position > rep.Admitted {
				r.violate("position %d admitted past the counter %d", b.position, rep.Admitted)
			}
			if latestWaiting.After(b.firstAdmitted.Add(r.o.Refresh)) {
				r.violate("position %d admitted at %v while an earlier place was still waiting at %v", b.position,
					b.firstAdmitted.Format(time.StampMilli), latestWaiting.Format(time.StampMilli))
			}
		}
		if b.lastWaiting.After(latestWaiting) {
			latestWaiting = b.lastWaiting
		}
	}
}

// checkSoldOut checks nobody was admitted after the sold-out, and times
// how long every waiting buyer, polling or by event stream, took to be
// told.
func (r *runner) checkSoldOut(rep *Report, lastSale time.Time) {
	var told []time.Duration
	for i := range r.buyers {
		b := &r.buyers[i]
		if !b.firstAdmitted.IsZero() && b.firstAdmitted.After(lastSale.Add(r.o.Refresh)) {
			r.violate("buyer %d first saw its admission %v after the last sale", i, b.firstAdmitted.Sub(lastSale))
		}
		if !b.soldOutAt.IsZero() {
			told = append(told, max(b.soldOutAt.Sub(lastSale), 0))
		}
	}
	rep.ToldSoldOutP50, rep.ToldSoldOutMax = quantile(told, 0.5), quantile(told, 1)
	var streamTold []time.Duration
	for _, at := range r.streamHeard {
		streamTold = append(streamTold, max(at.Sub(lastSale), 0))
	}
	rep.StreamsHeard = len(streamTold)
	rep.StreamErrors = r.streamErrs.Load()
	rep.StreamsWaiting = min(r.o.Streams, len(r.tickets)) - int(r.streamLeft.Load())
	if rep.StreamsHeard < rep.StreamsWaiting {
		r.violate("%d of the %d event streams still waiting never heard sold-out", rep.StreamsWaiting-rep.StreamsHeard, rep.StreamsWaiting)
	}
	rep.StreamToldP50, rep.StreamToldMax = quantile(streamTold, 0.5), quantile(streamTold, 1)
}

// follow opens the event streams of the Options.Streams buyers who joined
// last, each on a connection of its own, and notes when each hears
// sold-out. heard waits up to within for the streams that have not, ends
// the rest, and returns the times heard. Call after every buyer joined.
func (r *runner) follow(ctx context.Context) (heard func(within time.Duration) []time.Time) {
	ctx, cancel := context.WithCancel(ctx)
	n := min(r.o.Streams, len(r.tickets))
	times := make([]time.Time, n)
	var wg sync.WaitGroup
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: max(n, 1)}}
	for k := range n {
		i := len(r.tickets) - 1 - k
		wg.Go(func() { // owned by follow: ends at sold-out or when heard cancels it
			base := r.o.BaseURLs[i%len(r.o.BaseURLs)]
			// As a browser's EventSource does: a stream that ends (an
			// error event, a replica draining) is opened again after the
			// retry the stream asked for.
			for retry := time.Duration(0); ; {
				select {
				case <-ctx.Done():
					return
				case <-time.After(retry):
				}
				retry = 3 * time.Second // EventSource's default, until the stream says
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/programs/"+r.o.Program+"/queue/"+r.tickets[i]+"/events", nil)
				if err != nil {
					return
				}
				r.header(req, "", "", false)
				resp, err := cl.Do(req)
				if err != nil {
					r.reopen("%v", err)
					continue
				}
				if resp.StatusCode != http.StatusOK {
					b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
					resp.Body.Close()
					r.reopen("%d %s", resp.StatusCode, b)
					continue
				}
				sc := bufio.NewScanner(resp.Body)
				last := ""
				for sc.Scan() {
					line := sc.Text()
					if strings.HasPrefix(line, "data: ") {
						last = line
					}
					if ms, ok := strings.CutPrefix(line, "retry: "); ok {
						if n, err := strconv.Atoi(ms); err == nil {
							retry = time.Duration(n) * time.Millisecond
						}
					}
					if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"state":"sold-out"`) {
						times[k] = time.Now()
						resp.Body.Close()
						return
					}
					// Admitted (the buyer buys or walks away) or past its
					// window: out of the line, it waits for no sold-out.
					// (An early join's place is drawn at the opening, so the
					// last to join are not always the last in line.)
					if strings.HasPrefix(line, "data: ") && (strings.Contains(line, `"state":"admitted"`) || strings.Contains(line, `"state":"expired"`)) {
						r.streamLeft.Add(1)
						resp.Body.Close()
						return
					}
					if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"type":`) {
						r.reopen("%s", line)
					}
				}
				resp.Body.Close()
				if ctx.Err() == nil {
					r.reopen("the stream ended (%v) after %s", sc.Err(), last[max(len(last)-200, 0):])
				}
			}
		})
	}
	return func(within time.Duration) []time.Time {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }() // ends once every stream has
		select {
		case <-done:
		case <-time.After(within):
		}
		cancel()
		<-done
		var out []time.Time
		for _, t := range times {
			if !t.IsZero() {
				out = append(out, t)
			}
		}
		return out
	}
}

// reopen counts a stream opened again, and says why.
func (r *runner) reopen(format string, args ...any) {
	r.streamErrs.Add(1)
	if r.o.Progress != nil {
		fmt.Fprintf(r.o.Progress, "onsale: a stream opened again: "+format+"\n", args...)
	}
}

// quantile of ds (sorted in place); 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(int(q*float64(len(ds))), len(ds)-1)]
}
