// Package onsale drives an on-sale through a gateway's waiting room the
// way its buyers would, and checks what the waiting room promises: every
// buyer joins, polls as Retry-After tells it, buys once admitted (or walks
// away), and the run verifies, from what the buyers saw and what the
// gateway reports, that every ticket sold, that admission went in position
// order and never past the stock's slack, that nobody was admitted after
// the sold-out, and that every waiting buyer was told sold-out within one
// refresh of the last sale. `stockbench run -scenario onsale` and the
// gateway's tests run it; it talks to the gateway over HTTP only.
package onsale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockgate/stockgate/client"
)

// Options describe one on-sale run.
type Options struct {
	// BaseURLs are the gateway's replicas (buyer i uses BaseURLs[i mod n]);
	// at least one.
	BaseURLs []string
	Admin    *client.Client // admin calls on the same ledger and Redis; required
	Program  string         // a new program id; required
	// Buyers join the line; Tickets are for sale (one per buyer); Abandon
	// is the share of admitted buyers who walk away without buying.
	Buyers, Tickets int
	Abandon         float64
	// The waiting room: admissions per second at most, the admission
	// window, admitted-but-unused per ticket left.
	Rate         int64
	Window       time.Duration
	PerRemaining float64
	// SoldOutShare is the room's sold-out share (nil: the room's default).
	SoldOutShare *float64
	// Workers bounds the requests in flight (connections).
	Workers int
	// Streams of the buyers who joined last also follow their places as
	// Server-Sent Events (connections of their own), to time the
	// sold-out notice on a stream.
	Streams int
	// Refresh is the gateway's memory of a line (waitroom.Refresh): the
	// bound on how stale a buyer's answer may be.
	Refresh time.Duration
	// Seed picks who walks away.
	Seed uint64
	// Header goes on every request (a platform edge's credentials).
	Header http.Header
	// Progress, when not nil, gets a line every few seconds.
	Progress io.Writer
	// Timeout bounds the whole run; default 10 minutes.
	Timeout time.Duration
}

func (o Options) validate() error {
	switch {
	case len(o.BaseURLs) == 0 || o.Admin == nil || o.Program == "":
		return errors.New("onsale: BaseURLs, Admin and Program are required")
	case o.Buyers < 1 || o.Tickets < 1:
		return errors.New("onsale: at least one buyer and one ticket")
	case o.Abandon < 0 || o.Abandon >= 1:
		return errors.New("onsale: Abandon must be in [0, 1)")
	case o.Rate < 1 || o.Window < time.Second || o.PerRemaining <= 0:
		return errors.New("onsale: Rate >= 1, Window >= 1s and PerRemaining > 0")
	case o.Workers < 1 || o.Refresh <= 0:
		return errors.New("onsale: Workers >= 1 and Refresh > 0")
	}
	return nil
}

// Report is what the run saw and measured. Violations lists every promise
// the run saw broken (empty: none).
type Report struct {
	Buyers, Tickets int
	// Joins: how long the buyers took to join, and the join rate.
	JoinTime  time.Duration
	JoinRate  float64
	JoinP99   time.Duration
	Polls     int64
	PollRate  float64
	PollP99   time.Duration
	Purchases int64 // purchase requests sent (retries included)
	// Sold: 201 answers; LedgerSold the gateway's count.
	Sold, LedgerSold int64
	// Admitted: the line's serving counter at the end; SeenAdmitted the
	// buyers who saw their admission; Walked those of them who walked
	// away; Refused those who tried to buy and found it sold out; Late
	// those whose purchase, or whose check after asking while waiting,
	// came after the window (a machine too busy to answer in time); Unseen
	// the other admitted who never saw it (told sold-out first).
	Admitted, SeenAdmitted, Walked, Refused, Late, Unseen int64
	// Slack is the most admitted-but-unused buyers the room allows
	// (tickets x per_remaining, rounded up).
	Slack int64
	// SaleTime is from the first admission to the last sale.
	SaleTime time.Duration
	// ToldSoldOut: how long after the last sale waiting buyers first heard
	// sold-out (they poll as Retry-After says), median and most; Swept
	// the waiting buyers checked once a refresh after the last sale, all
	// told sold-out unless a violation says otherwise.
	ToldSoldOutP50, ToldSoldOutMax time.Duration
	// StreamsHeard of the Streams heard sold-out on their event streams,
	// StreamToldP50 and StreamToldMax how long after the last sale.
	StreamsHeard int
	// StreamsWaiting of the Streams were still waiting when the show sold
	// out (the others' buyers were admitted first).
	StreamsWaiting int
	// StreamErrors is how many times a stream was opened again: it could
	// not be opened, or it ended before sold-out.
	StreamErrors                 int64
	StreamToldP50, StreamToldMax time.Duration
	Swept                        int
	SweepTime                    time.Duration
	Errors                       int64 // transport errors and 5xx answers (retried)
	Violations                   []string
}

// buyer is what one buyer saw; only its own goroutine writes it.
type buyer struct {
	url           string // the replica it talks to
	ticket        string
	position      int64
	firstAdmitted time.Time // when it first saw admitted
	lastWaiting   time.Time // when it last saw waiting
	waitingAsked  time.Time // when it sent the request that answered so
	soldOutAt     time.Time // when it first saw sold-out
	boughtAt      time.Time
	walked        bool
	refused       bool
	expired       bool
	done          bool
}

type runner struct {
	o    Options
	http *http.Client
	// buyHTTP sends purchases on connections of their own: a buyer's
	// purchase does not queue behind other buyers' polls in this process.
	buyHTTP *http.Client
	// slots and buySlots bound the requests in flight; a request's time
	// is counted from when it has its slot, so a latency is the gateway's,
	// not this process's queue of buyers.
	slots, buySlots chan struct{}
	buyers          []buyer
	// tickets are the buyers' queue tickets, each written before its
	// buyer is counted joined (for the streams); streamHeard when each
	// stream heard sold-out.
	tickets     []string
	streamHeard []time.Time
	streamErrs  atomic.Int64 // streams opened again
	streamLeft  atomic.Int64 // streams whose buyer was admitted: they wait for no sold-out
	polls       atomic.Int64
	buys        atomic.Int64
	errs        atomic.Int64
	mu          sync.Mutex
	pollLat     []time.Duration
	joinLat     []time.Duration
	bad         []string
}

// Run runs the on-sale and returns its report; err is for a run that could
// not be made (the gateway refused its setup, or the run timed out).
func Run(ctx context.Context, o Options) (Report, error) {
	if err := o.validate(); err != nil {
		return Report{}, err
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	// Workers requests in flight at most, and a quarter more for
	// purchases, each on a connection of its own.
	buyWorkers := max(o.Workers/4, 4)
	tr := &http.Transport{MaxIdleConnsPerHost: o.Workers, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	buyTr := &http.Transport{MaxIdleConnsPerHost: buyWorkers, IdleConnTimeout: time.Minute}
	defer buyTr.CloseIdleConnections()
	r := &runner{o: o, http: &http.Client{Transport: tr, Timeout: 30 * time.Second}, buyHTTP: &http.Client{Transport: buyTr, Timeout: 30 * time.Second},
		slots: make(chan struct{}, o.Workers), buySlots: make(chan struct{}, buyWorkers), buyers: make([]buyer, o.Buyers),
		tickets: make([]string, o.Buyers)}
	sku := client.SKU{Program: o.Program, Ticket: "ga"}
	total, shards, one := int64(o.Tickets), 4, int64(1)
	if _, err := o.Admin.PutSKU(ctx, sku, client.SKUConfig{Total: &total, Shards: &shards, MaxPerOrder: &one}); err != nil {
		return Report{}, fmt.Errorf("onsale: put sku: %w", err)
	}
	secs := int64(o.Window / time.Second)
	zero := int64(0)
	if _, err := o.Admin.PutQueue(ctx, o.Program, client.QueueConfig{OpensInSeconds: &zero, RatePerSecond: o.Rate,
		WindowSeconds: secs, PerRemaining: o.PerRemaining, SoldOutShare: o.SoldOutShare}); err != nil {
		return Report{}, fmt.Errorf("onsale: put queue: %w", err)
	}

	// The buyers: each joins, then polls and buys on its own.
	start := time.Now()
	var joined, wg sync.WaitGroup
	joined.Add(o.Buyers)
	rng := rand.New(rand.NewPCG(o.Seed, 1))
	walks := make([]bool, o.Buyers)
	for i := range walks {
		walks[i] = rng.Float64() < o.Abandon
	}
	var joinEnd atomic.Int64
	for i := range o.Buyers {
		wg.Add(1)
		go func() { // owned by Run: it waits for every buyer
			defer wg.Done()
			r.buyer(ctx, i, walks[i], &joined, &joinEnd)
		}()
	}
	stopProgress := r.progress(ctx)
	joined.Wait()
	joinTime := time.Duration(joinEnd.Load() - start.UnixNano())
	pollStart := time.Now()
	heard := r.follow(ctx)
	wg.Wait()
	stopProgress()
	pollTime := time.Since(pollStart)
	r.streamHeard = heard(5 * time.Second) // the streams' last notices are in flight still
	if ctx.Err() != nil {
		return Report{}, fmt.Errorf("onsale: the run did not end within %v", o.Timeout)
	}

	rep := Report{Buyers: o.Buyers, Tickets: o.Tickets, JoinTime: joinTime, Polls: r.polls.Load(), Purchases: r.buys.Load(),
		Errors: r.errs.Load(), Slack: int64(math.Ceil(float64(o.Tickets) * o.PerRemaining))}
	rep.JoinRate = float64(o.Buyers) / max(joinTime.Seconds(), 1e-9)
	rep.PollRate = float64(rep.Polls) / max(pollTime.Seconds(), 1e-9)
	rep.JoinP99, rep.PollP99 = quantile(r.joinLat, 0.99), quantile(r.pollLat, 0.99)
	r.verify(ctx, &rep)
	return rep, nil
}

// buyer is one buyer's life: join, poll as told, buy once admitted or walk
// away, until it bought, walked, or heard sold-out.
func (r *runner) buyer(ctx context.Context, i int, walks bool, joined *sync.WaitGroup, joinEnd *atomic.Int64) {
	b := &r.buyers[i]
	b.url = r.o.BaseURLs[i%len(r.o.BaseURLs)]
	name := fmt.Sprintf("%s-b%d", r.o.Program, i)
	var st status
	var asked time.Time // when the request that answered st was sent
	for {
		var ok bool
		asked = time.Now()
		st, ok = r.call(ctx, http.MethodPost, b.url+"/v1/programs/"+r.o.Program+"/queue", "", "", `{"buyer":"`+name+`"}`, &r.joinLat)
		if ok || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	for now := time.Now().UnixNano(); ; {
		if was := joinEnd.Load(); was >= now || joinEnd.CompareAndSwap(was, now) {
			break
		}
	}
	r.tickets[i] = st.Ticket
	joined.Done()
	b.ticket, b.position = st.Ticket, st.Position
	// The longest Retry-After a placed buyer may be told: half the window,
	// rounded up to whole seconds, so an admission is seen while it lasts.
	longest := int64((max(r.o.Window/2, time.Second) + time.Second - 1) / time.Second)
	for now := time.Now(); ctx.Err() == nil; {
		switch st.State {
		case "waiting":
			b.lastWaiting, b.waitingAsked = now, asked
			if st.Position > 0 && st.RetryAfter > longest {
				r.violate("%s was told Retry-After %ds, longer than half the %v window", name, st.RetryAfter, r.o.Window)
			}
			wait := time.Duration(max(st.RetryAfter, 1)) * time.Second
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		case "admitted":
			if b.firstAdmitted.IsZero() {
				b.firstAdmitted, b.position = now, st.Position
			}
			if walks {
				b.walked, b.done = true, true
				return
			}
			r.buy(ctx, b, name, st.Admission)
			return
		case "sold-out":
			b.soldOutAt, b.done = now, true
			return
		case "expired":
			// Admitted and back after its window. The gateway is at fault if
			// the buyer came back in time: the request that saw waiting went
			// out less than the window (less a refresh, the lag of a
			// replica's memory) before this answer, so the admission was
			// older than that request and the gateway said to wait. Else
			// the buyer's round trip outran the window (a machine too busy
			// to answer or to wake it in time): late, as a late purchase.
			b.expired, b.done = true, true
			if now.Sub(b.waitingAsked) < r.o.Window-r.o.Refresh {
				r.violate("%s saw expired %v after asking while waiting, within the %v window", name,
					now.Sub(b.waitingAsked).Round(time.Millisecond), r.o.Window)
			}
			return
		default:
			r.violate("%s: state %q", name, st.State)
			return
		}
		sent := time.Now()
		got, ok := r.call(ctx, http.MethodGet, b.url+"/v1/programs/"+r.o.Program+"/queue/"+b.ticket, "", "", "", &r.pollLat)
		if !ok {
			time.Sleep(time.Second)
			continue // as it stood: waiting again, from the answer it had
		}
		asked, now = sent, time.Now()
		r.polls.Add(1)
		st = got
	}
}

// buy buys one ticket with the admission, retrying a 503 with its key.
func (r *runner) buy(ctx context.Context, b *buyer, name, token string) {
	body := `{"buyer":"` + name + `","quantity":1}`
	for attempt := 0; ctx.Err() == nil; attempt++ {
		r.buys.Add(1)
		code, kind, retry, err := r.post(ctx, b.url+"/v1/skus/"+r.o.Program+"/ga/purchases", "k-"+name, token, body)
		switch {
		case err == nil && code == http.StatusCreated:
			b.boughtAt, b.done = time.Now(), true
			return
		case err == nil && code == http.StatusConflict && kind == "sold-out":
			b.refused, b.done = true, true
			return
		case err == nil && code == http.StatusGone && kind == "admission-expired":
			// It came back too late (a gateway too busy to answer in time).
			b.expired, b.done = true, true
			return
		case err != nil || code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests:
			r.errs.Add(1)
			if attempt == 20 {
				r.violate("%s: purchase still failing after 20 tries (%d %v)", name, code, err)
				return
			}
			time.Sleep(time.Duration(max(retry, 1)) * time.Second)
		default:
			r.violate("%s: purchase = %d %s", name, code, kind)
			return
		}
	}
}

// status is a join's or check's answer.
type status struct {
	Ticket     string `json:"ticket"`
	State      string `json:"state"`
	Position   int64  `json:"position"`
	Admission  string `json:"admission_token"`
	RetryAfter int64  `json:"retry_after_seconds"`
}

// call sends a queue request; ok false for a failure (counted in Errors),
// which the buyer retries after a second.
func (r *runner) call(ctx context.Context, method, url, key, token, body string, lat *[]time.Duration) (status, bool) {
	var st status
	select {
	case r.slots <- struct{}{}:
	case <-ctx.Done():
		return st, false
	}
	defer func() { <-r.slots }()
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewBufferString(body))
	if err != nil {
		panic(err) // the run's own URLs
	}
	r.header(req, key, token, body != "")
	resp, err := r.http.Do(req)
	if err == nil {
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err == nil && resp.StatusCode >= 300 {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			r.errs.Add(1)
		}
		return st, false
	}
	r.mu.Lock()
	*lat = append(*lat, time.Since(start))
	r.mu.Unlock()
	return st, true
}

func (r *runner) header(req *http.Request, key, token string, body bool) {
	for k, vs := range r.o.Header {
		req.Header[k] = vs
	}
	if body {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if token != "" {
		req.Header.Set("Admission-Token", token)
	}
}

// post sends a purchase and returns its status, problem kind and
// Retry-After.
func (r *runner) post(ctx context.Context, url, key, token, body string) (code int, kind string, retry int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		panic(err)
	}
	r.header(req, key, token, true)
	select {
	case r.buySlots <- struct{}{}:
	case <-ctx.Done():
		return 0, "", 0, ctx.Err()
	}
	defer func() { <-r.buySlots }()
	resp, err := r.buyHTTP.Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	defer resp.Body.Close()
	var p struct{ Type string }
	_ = json.NewDecoder(resp.Body).Decode(&p)
	if i := lastSlash(p.Type); i >= 0 {
		kind = p.Type[i+1:]
	}
	retry, _ = strconv.Atoi(resp.Header.Get("Retry-After"))
	return resp.StatusCode, kind, retry, nil
}

func lastSlash(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			return i
		}
	}
	return -1
}

func (r *runner) violate(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bad) < 50 {
		r.bad = append(r.bad, fmt.Sprintf(format, args...))
	}
}

// progress writes a line every 5 seconds until its stop is called.
func (r *runner) progress(ctx context.Context) (stop func()) {
	if r.o.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by progress: stop waits for it
		defer wg.Done()
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				r.mu.Lock()
				joins := len(r.joinLat)
				r.mu.Unlock()
				fmt.Fprintf(r.o.Progress, "onsale: %d joined, %d polls, %d purchases sent, %d errors\n",
					joins, r.polls.Load(), r.buys.Load(), r.errs.Load())
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
