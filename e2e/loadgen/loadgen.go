// Package loadgen drives HTTP load at stockgate (or anything that speaks its
// purchase API) with vegeta: open loop at a fixed rate, or as fast as a fixed
// set of workers can go, and sums the answers up with an HDR histogram (no
// coordinated omission in the open-loop mode: a late answer counts from the
// moment it was due). It also writes a latency-over-time plot.
package loadgen

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	vegeta "github.com/tsenart/vegeta/v12/lib"
	"github.com/tsenart/vegeta/v12/lib/plot"
)

// Request is one call a scenario makes.
type Request struct {
	Method string
	Path   string
	Body   string
	Header http.Header
}

// Scenario makes the i-th request of a run (i from 0). It returns false
// when the scenario has no more requests.
type Scenario func(i uint64) (Request, bool)

// Run configures one attack.
type Run struct {
	Name     string
	BaseURL  string
	Scenario Scenario
	// Rate is the open-loop rate in requests per second; 0 runs as fast as
	// Workers allow (a throughput test, closed loop).
	Rate int
	// RateEnd, when set, ramps the rate linearly from Rate at the start to
	// RateEnd at Duration (which it needs).
	RateEnd int
	// Header is added to every request (a platform's edge credentials).
	Header   http.Header
	Workers  uint64        // default 64
	Duration time.Duration // 0: until the scenario runs out
	Timeout  time.Duration // per request; default 10s
	// Progress, when set, receives a progress line every second.
	Progress io.Writer
	// Plot, when set, is the path of an HTML latency-over-time chart.
	Plot string
	// Collect, when set, sees every answer's status and body.
	Collect func(code int, body []byte)
}

// Result sums one attack up.
type Result struct {
	Name     string
	Requests uint64
	Elapsed  time.Duration
	Codes    map[int]uint64 // 0 means a transport error
	Errors   map[string]uint64
	// Open loop only: Late counts requests the tool itself sent more
	// than lateAfter after they were due (all its workers were waiting for
	// answers), and MaxLag is the latest. A latency counts from when its
	// request was due, so lateness is in it; ToolLimited says the tool's
	// in-flight cap, not the server, set the pace of the run.
	Late   uint64
	MaxLag time.Duration
	Asked  float64 // the requests a second asked for (open loop)
	// FirstConflict and LastCreated are when the first 409 and the last
	// 201 were answered: in a flash sale, LastCreated past FirstConflict
	// is a window in which some buyers were told sold out while units
	// were still sold to others (stranded on shards their probes missed).
	FirstConflict, LastCreated time.Time
	// Seconds: the answers by status, per second of the run the request
	// was sent in (a fault's 503s, when they began and ended).
	Seconds   map[int][]uint64
	latencies *hdrhistogram.Histogram
	byCode    map[int]*hdrhistogram.Histogram // the same latencies, per status
}

// newLatencies holds latencies from 1 µs to a minute, 3 digits.
func newLatencies() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)
}

// lateAfter is how late a request may start before it counts as late.
const lateAfter = 10 * time.Millisecond

// SoldOutWindow is how long after the first 409 the last 201 was
// answered (0 when none was).
func (r Result) SoldOutWindow() time.Duration {
	if r.FirstConflict.IsZero() || !r.LastCreated.After(r.FirstConflict) {
		return 0
	}
	return r.LastCreated.Sub(r.FirstConflict)
}

// ToolLimited reports an open-loop run in which more than 1 % of the
// requests went out late: the tool's workers (Workers × 16 in flight)
// were all waiting, so what it measured is partly its own queue.
func (r Result) ToolLimited() bool { return r.Requests > 0 && r.Late*100 > r.Requests }

// Note is a line saying the tool limited the run ("" when it did not).
func (r Result) Note() string {
	if !r.ToolLimited() {
		return ""
	}
	return fmt.Sprintf("%s: the load tool limited this run, not the server: %d of %d requests started more than %v late (up to %v), "+
		"sending %.0f/s of the %.0f/s asked; every latency counts from when its request was due",
		r.Name, r.Late, r.Requests, lateAfter, r.MaxLag.Round(time.Millisecond), r.Throughput(), r.Asked)
}

// Throughput is answered requests per second.
func (r Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Quantile is a latency quantile (0..100).
func (r Result) Quantile(q float64) time.Duration {
	if r.latencies == nil {
		return 0
	}
	return time.Duration(r.latencies.ValueAtQuantile(q)) * time.Microsecond
}

// QuantileOf is the latency at quantile q of the answers with the status
// code (0 when there were none): a shed 503 decided at once and a 201
// that waited on a slow ledger are told apart.
func (r Result) QuantileOf(code int, q float64) time.Duration {
	h := r.byCode[code]
	if h == nil {
		return 0
	}
	return time.Duration(h.ValueAtQuantile(q)) * time.Microsecond
}

// Count is how many answers had the status code.
func (r Result) Count(code int) uint64 { return r.Codes[code] }

// CodesString lists the answers by status, "201:1000 409:9000".
func (r Result) CodesString() string {
	var codes []int
	for c := range r.Codes {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d:%d", c, r.Codes[c]))
	}
	return strings.Join(parts, " ")
}

var errDone = errors.New("loadgen: scenario done")

// Attack runs r and returns its result.
func Attack(r Run) (Result, error) {
	if r.Workers == 0 {
		r.Workers = 64
	}
	if r.Timeout == 0 {
		r.Timeout = 10 * time.Second
	}
	if r.RateEnd > 0 && (r.Duration <= 0 || r.Rate <= 0) {
		return Result{}, errors.New("loadgen: a ramp needs a start rate and a duration")
	}
	atk, pacer := r.attacker()
	res := Result{Name: r.Name, Codes: map[int]uint64{}, Errors: map[string]uint64{}, Seconds: map[int][]uint64{},
		latencies: newLatencies(), byCode: map[int]*hdrhistogram.Histogram{}}
	var p *plot.Plot
	if r.Plot != "" {
		p = plot.New(plot.Title(r.Name), plot.Downsample(4000))
	}
	start := time.Now()
	next := start.Add(time.Second)
	due := r.dueTime(start)
	for hit := range atk.Attack(r.targeter(), pacer, r.Duration, r.Name) {
		if hit.Error == errDone.Error() {
			continue // the scenario ran out: not a request
		}
		res.record(hit, start, due)
		if r.Collect != nil {
			r.Collect(int(hit.Code), hit.Body)
		}
		if p != nil {
			_ = p.Add(hit)
		}
		if r.Progress != nil && time.Now().After(next) {
			el := time.Since(start)
			fmt.Fprintf(r.Progress, "\r[%s] %5.1fs %9d requests %8.0f/s p99 %v   ", r.Name, el.Seconds(), res.Requests,
				float64(res.Requests)/el.Seconds(), res.Quantile(99))
			next = next.Add(time.Second)
		}
	}
	res.Elapsed = time.Since(start)
	if r.Rate > 0 {
		res.Asked = float64(r.Rate)
		if r.RateEnd > 0 {
			res.Asked = float64(r.Rate+r.RateEnd) / 2
		}
	}
	if r.Progress != nil {
		fmt.Fprintf(r.Progress, "\r[%s] done: %d requests in %v, %.0f/s, %s\n", r.Name, res.Requests,
			res.Elapsed.Round(time.Millisecond), res.Throughput(), res.CodesString())
		if n := res.Note(); n != "" {
			fmt.Fprintln(r.Progress, n)
		}
	}
	if p != nil {
		return res, writePlot(r.Plot, p)
	}
	return res, nil
}

// targeter turns r's scenario into vegeta's targets, r.Header added to
// each; it says errDone when the scenario runs out.
func (r Run) targeter() vegeta.Targeter {
	var seq atomic.Uint64
	return func(t *vegeta.Target) error {
		req, ok := r.Scenario(seq.Add(1) - 1)
		if !ok {
			return errDone
		}
		t.Method, t.URL, t.Header = req.Method, r.BaseURL+req.Path, req.Header
		if len(r.Header) > 0 {
			t.Header = req.Header.Clone()
			if t.Header == nil {
				t.Header = http.Header{}
			}
			for k, vs := range r.Header {
				t.Header[k] = append(t.Header[k], vs...)
			}
		}
		t.Body = []byte(req.Body)
		return nil
	}
}

// attacker is r's vegeta attacker and pacer: r.Rate a second, or closed
// loop over r.Workers when 0.
func (r Run) attacker() (*vegeta.Attacker, vegeta.Pacer) {
	pacer, inFlight := r.pacer(), r.Workers*16
	if r.Rate == 0 {
		pacer, inFlight = vegeta.ConstantPacer{}, r.Workers
	}
	// As many connections as requests in flight: a request that waited
	// for one inside the transport would count that wait against its
	// Timeout, unseen by the server. With twice Workers (128 for 64,
	// against 1,024 in flight), a ledger fault's 4 s answers at 900
	// requests/s queued the tool's own requests past 10 s: 497 "timeouts"
	// while the gateway answered every request within 5 s. A request
	// that finds every worker busy is counted Late instead. And as many
	// kept idle: with Workers idle, every connection past them was closed
	// after its answer and dialled again for the next burst; an open loop
	// after a crowd run left 23,000 sockets of the 28,000 loopback ports
	// in TIME_WAIT, and the tool spent 85 % of its CPU in connect()
	// looking for a free port (admission p99 6 s, the gateway at 30 % of a
	// core: `suite -only admit` after a steady, crowd and overload run).
	opts := []func(*vegeta.Attacker){vegeta.Timeout(r.Timeout), vegeta.KeepAlive(true),
		vegeta.Connections(int(inFlight)), vegeta.MaxConnections(int(inFlight)),
		vegeta.Workers(r.Workers), vegeta.MaxWorkers(inFlight)}
	return vegeta.NewAttacker(opts...), pacer
}

// record counts one answer into res. due is when an open loop's request
// was due (nil: closed loop).
func (res *Result) record(hit *vegeta.Result, start time.Time, due func(uint64) time.Time) {
	res.Requests++
	res.Codes[int(hit.Code)]++
	if sec := int(max(hit.Timestamp.Sub(start), 0) / time.Second); sec < 3600 {
		per := res.Seconds[int(hit.Code)]
		for len(per) <= sec {
			per = append(per, 0)
		}
		per[sec]++
		res.Seconds[int(hit.Code)] = per
	}
	switch answered := hit.Timestamp.Add(hit.Latency); {
	case hit.Code == http.StatusConflict && (res.FirstConflict.IsZero() || answered.Before(res.FirstConflict)):
		res.FirstConflict = answered
	case hit.Code == http.StatusCreated && answered.After(res.LastCreated):
		res.LastCreated = answered
	}
	if hit.Error != "" && hit.Code == 0 {
		res.Errors[hit.Error]++
	}
	latency := hit.Latency
	if due != nil {
		// Open loop: from when the request was due, not when the tool got
		// round to sending it (no coordinated omission).
		if lag := hit.Timestamp.Sub(due(hit.Seq)); lag > 0 {
			latency += lag
			res.MaxLag = max(res.MaxLag, lag)
			if lag > lateAfter {
				res.Late++
			}
		}
	}
	_ = res.latencies.RecordValue(latency.Microseconds())
	h := res.byCode[int(hit.Code)]
	if h == nil {
		h = newLatencies()
		res.byCode[int(hit.Code)] = h
	}
	_ = h.RecordValue(latency.Microseconds())
}

// writePlot writes p's chart to path.
func writePlot(path string, p *plot.Plot) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := p.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// dueTime is when request seq of an open-loop run started at start was
// due, by its pacer (nil for a closed-loop run).
func (r Run) dueTime(start time.Time) func(seq uint64) time.Time {
	switch {
	case r.Rate <= 0:
		return nil
	case r.RateEnd == 0:
		per := float64(time.Second) / float64(r.Rate)
		return func(seq uint64) time.Time { return start.Add(time.Duration(float64(seq) * per)) }
	}
	// A linear ramp: hits(t) = a t + s t²/2, solved for t.
	a := float64(r.Rate)
	slope := float64(r.RateEnd-r.Rate) / r.Duration.Seconds()
	return func(seq uint64) time.Time {
		n := float64(seq)
		t := n / a
		if slope != 0 {
			t = (-a + math.Sqrt(a*a+2*slope*n)) / slope
		}
		return start.Add(time.Duration(t * float64(time.Second)))
	}
}

// pacer paces an open-loop run: constant at Rate, or from Rate to RateEnd
// over Duration.
func (r Run) pacer() vegeta.Pacer {
	start := vegeta.ConstantPacer{Freq: r.Rate, Per: time.Second}
	if r.RateEnd == 0 || r.Rate == 0 {
		return start
	}
	return vegeta.LinearPacer{StartAt: start, Slope: float64(r.RateEnd-r.Rate) / r.Duration.Seconds()}
}

// Summary is a result for machines (stockbench run -json).
type Summary struct {
	Name              string             `json:"name"`
	Requests          uint64             `json:"requests"`
	ElapsedSeconds    float64            `json:"elapsed_seconds"`
	RequestsPerSecond float64            `json:"requests_per_second"`
	Codes             map[string]uint64  `json:"codes"` // by status; "0" is a transport error
	Errors            map[string]uint64  `json:"errors,omitempty"`
	LatencyMS         map[string]float64 `json:"latency_ms"` // p50, p90, p99, p99.9, max
	// ToolLimited: the tool's own in-flight cap set the pace (open loop).
	ToolLimited bool    `json:"tool_limited,omitempty"`
	LateSends   uint64  `json:"late_sends,omitempty"`
	MaxLagMS    float64 `json:"max_send_lag_ms,omitempty"`
}

// Summary sums the result up for machines.
func (r Result) Summary() Summary {
	s := Summary{Name: r.Name, Requests: r.Requests, ElapsedSeconds: r.Elapsed.Seconds(), RequestsPerSecond: r.Throughput(),
		Codes: map[string]uint64{}, Errors: r.Errors, LatencyMS: map[string]float64{}}
	for c, n := range r.Codes {
		s.Codes[fmt.Sprint(c)] = n
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, q := range []float64{50, 90, 99, 99.9} {
		s.LatencyMS[fmt.Sprintf("p%g", q)] = ms(r.Quantile(q))
	}
	if r.latencies != nil {
		s.LatencyMS["max"] = ms(time.Duration(r.latencies.Max()) * time.Microsecond)
	}
	s.ToolLimited, s.LateSends, s.MaxLagMS = r.ToolLimited(), r.Late, ms(r.MaxLag)
	return s
}

// Table formats results as a Markdown table.
func Table(rs []Result) string {
	var b strings.Builder
	b.WriteString("| run | requests | req/s | answers | p50 | p90 | p99 | p99.9 |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		name := r.Name
		if r.ToolLimited() {
			name += " (tool-limited)"
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %v | %v | %v | %v |\n", name, r.Requests, r.Throughput(), r.CodesString(),
			r.Quantile(50), r.Quantile(90), r.Quantile(99), r.Quantile(99.9))
	}
	return b.String()
}
