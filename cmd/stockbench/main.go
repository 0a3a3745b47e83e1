// Command stockbench is stockgate's load tool and benchmark.
//
//	stockbench run -url http://localhost:8080 -scenario flash -n 100000
//	    drives one scenario at a running gateway (flash, steady, reads,
//	    soldout, holds, carts) and prints a summary table and a ledger
//	    audit. A cart is one ticket of each of 3 SKUs of the run's program.
//	    -run-id ID      goes into every Idempotency-Key and buyer (random
//	                    8 hex digits by default), so runs never collide;
//	                    the same id sends the same keys again
//	    -n N            requests (default 50,000; 0: until -duration)
//	    -duration D     stop after D; without -n only D bounds the run,
//	                    with both the first reached stops it
//	    -rate R         open loop at R requests/s (default closed loop:
//	                    as fast as -workers are answered)
//	    -ramp A:B       open loop from A to B requests/s, linear over
//	                    -duration (which it needs)
//	    -sku P/T        drive the existing SKU P/T: no admin call, no
//	                    audit, no -admin-token needed
//	    -H 'Name: v'    a header on every request, admin calls too
//	                    (repeatable)
//	    -json           a JSON summary on stdout instead of the table
//	    -scenario onsale: -n buyers join a new program's waiting room for
//	    -tickets tickets (-admit-rate, -window, -per-remaining set the
//	    room), poll as Retry-After says and buy when admitted, -abandon of
//	    them walking away; it prints joins, polls, the sale and how fast
//	    waiting buyers heard sold-out, and exits 1 if a promise broke
//	    (every ticket sold, admission in order within the slack, nobody
//	    admitted after the sold-out, everyone told sold-out a refresh
//	    after the last sale)
//	    A flash sale's SKU gets a tenth of the requests the run will send
//	    as stock (1,000,000 assumed for a closed-loop run bounded only in
//	    time). A bad flag exits 2 with one line; -h lists every flag.
//	stockbench suite -out docs/BENCHMARKS.md
//	    starts its own Redis Cluster and PostgreSQL, runs stockgate and the
//	    approaches it replaces side by side on this machine, and writes the
//	    benchmark document (what `make bench` runs). -only room or
//	    -only buy runs only the waiting room's or the purchase latency's
//	    measurements and prints them.
//	stockbench compare -base REV
//	    the flash sale and the sold-out storm through the build at REV and
//	    the working tree side by side, interleaved (`make compare BASE=REV`).
//	stockbench floor -driver postgres -dsn URL -kind purchase -skus 100
//	    the ledger floor: the rows the ledger writes per winner, written
//	    by a plain program with the best batching found (see floor.go)
//	stockbench bare where
//	    the bare gin check answered in this process and in a process of its
//	    own, three interleaved rounds (why the suite's ceilings run apart).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/e2e/loadgen"
	"github.com/stockgate/stockgate/keys"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = runCmd(os.Args[2:], os.Stdout, os.Stderr)
	case "suite":
		err = suiteCmd(os.Args[2:])
	case "compare":
		err = compareCmd(os.Args[2:])
	case "bare": // the suite's bare gin ceilings, in a process of their own
		err = bareCmd(os.Args[2:])
	case "floor":
		err = floorCmd(os.Args[2:])
	case "faults":
		err = faultsCmd(os.Args[2:])
	default:
		usage()
	}
	var usage usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, &usage):
		fmt.Fprintln(os.Stderr, "stockbench:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "stockbench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: stockbench run [flags] | stockbench suite [flags] | stockbench compare [flags] | stockbench faults [flags]; -h for flags")
	os.Exit(2)
}

// usageError is a bad command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func badFlag(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// runConfig is what `stockbench run` was asked to do.
type runConfig struct {
	url, scenario, program, sku, runID, token, plot string
	n, workers                                      uint64
	rate, rateEnd, skus, shards                     int
	duration                                        time.Duration
	header                                          http.Header
	json                                            bool
	onsale                                          onsaleConfig
}

// onsaleConfig is the onsale scenario's sale and waiting room.
type onsaleConfig struct {
	tickets               int
	abandon, perRemaining float64
	admitRate             int64
	window                time.Duration
	soldOutShare          float64 // negative: the room's default
	streams               int
}

// headerFlag collects repeated -H 'Name: value' flags.
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if !ok || !isToken(name) || strings.ContainsFunc(value, isCTL) {
		return fmt.Errorf("want 'Name: value', got %q", v)
	}
	f.h.Add(name, value)
	return nil
}

// isToken reports whether s is an HTTP field name (RFC 9110 token). Checked
// here because net/http refuses a bad one only when it sends it: every
// request of the run would fail as a transport error.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}

// isCTL reports a control character a field value may not hold (tab may).
func isCTL(r rune) bool { return r != '\t' && (r < 0x20 || r == 0x7f) }

// parseRun reads run's flags. A bad flag is a usageError; -h is
// flag.ErrHelp.
func parseRun(args []string, stderr io.Writer) (runConfig, error) {
	c := runConfig{header: http.Header{}}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	// A bad flag is one line, printed by main; only -h lists the flags.
	fs.SetOutput(io.Discard)
	ramp := c.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintln(stderr, "usage: stockbench run [flags]")
			fs.PrintDefaults()
			return c, err
		}
		return c, usageError{err.Error() + " (stockbench run -h lists the flags)"}
	}
	if fs.NArg() > 0 {
		return c, badFlag("unexpected argument %q", fs.Arg(0))
	}
	if c.duration > 0 && !isSet(fs, "n") {
		c.n = 0 // "-duration 5m" means five minutes, not 50,000 requests
	}
	// In this order: the first one wrong is the one reported.
	checks := []func() error{c.checkScenario, c.checkOnsale, func() error { return c.setRamp(*ramp) }, c.checkPace, c.checkSKU, c.setIDs}
	for _, check := range checks {
		if err := check(); err != nil {
			return c, err
		}
	}
	return c, nil
}

// flags defines run's flags on fs, into c; it returns -ramp's, which
// setRamp reads.
func (c *runConfig) flags(fs *flag.FlagSet) *string {
	fs.StringVar(&c.url, "url", "http://localhost:8080", "gateway base URL")
	fs.StringVar(&c.scenario, "scenario", "flash", "flash, steady, reads, soldout, holds, carts, queue (joins a waiting room, then polls it) or onsale (-n buyers through a waiting room for -tickets, checked)")
	fs.IntVar(&c.onsale.tickets, "tickets", 1000, "onsale: tickets for sale")
	fs.Float64Var(&c.onsale.abandon, "abandon", 0.3, "onsale: share of admitted buyers who walk away")
	fs.Int64Var(&c.onsale.admitRate, "admit-rate", 1000, "onsale: the waiting room's admissions per second at most")
	fs.DurationVar(&c.onsale.window, "window", 5*time.Second, "onsale: the admission window (whole seconds)")
	fs.Float64Var(&c.onsale.perRemaining, "per-remaining", 1, "onsale: admitted-but-unused buyers per ticket left")
	fs.IntVar(&c.onsale.streams, "streams", 0, "onsale: the last buyers to join who also follow their places by event stream (to time the sold-out notice)")
	fs.Float64Var(&c.onsale.soldOutShare, "sold-out-share", -1, "onsale: the room's sold_out_share, 0..0.5 (negative: the room's default, 0.05)")
	fs.Uint64Var(&c.n, "n", 50_000, "requests; 0, or left out with -duration: until -duration")
	fs.DurationVar(&c.duration, "duration", 0, "stop after this long (0: after -n requests)")
	fs.IntVar(&c.rate, "rate", 0, "open-loop requests per second (0: as fast as -workers allow)")
	ramp := fs.String("ramp", "", "open-loop ramp START:END requests per second, linear over -duration")
	fs.Uint64Var(&c.workers, "workers", 64, "concurrent connections")
	fs.StringVar(&c.program, "program", "", "program id of the SKUs the run creates (default bench<unix time>)")
	fs.StringVar(&c.sku, "sku", "", "drive this existing SKU (program/ticket): no admin calls, no audit")
	fs.IntVar(&c.skus, "skus", 100, "SKUs for the steady scenario")
	fs.IntVar(&c.shards, "shards", 12, "Redis shards of each SKU the run creates, 1..256 (a gateway run with -auto-shards sizes them itself from there)")
	fs.StringVar(&c.runID, "run-id", "", "goes into every Idempotency-Key and buyer, so runs never collide (default random)")
	fs.Var(&headerFlag{c.header}, "H", "extra request header 'Name: value' (repeatable)")
	fs.BoolVar(&c.json, "json", false, "print a JSON summary instead of the table")
	fs.StringVar(&c.token, "admin-token", os.Getenv("STOCKGATE_ADMIN_TOKEN"), "admin bearer token")
	fs.StringVar(&c.plot, "plot", "", "write a latency-over-time HTML chart here")
	return ramp
}

// checkScenario checks -shards and -scenario.
func (c *runConfig) checkScenario() error {
	if c.shards < 1 || c.shards > 256 {
		return badFlag("-shards %d: want 1..256", c.shards)
	}
	switch c.scenario {
	case "flash", "steady", "reads", "soldout", "holds", "carts", "queue", "onsale":
		return nil
	}
	return badFlag("-scenario %q: want flash, steady, reads, soldout, holds, carts, queue or onsale", c.scenario)
}

// checkOnsale checks the onsale scenario's flags (none for another).
func (c *runConfig) checkOnsale() error {
	o := c.onsale
	if c.scenario != "onsale" {
		return nil
	}
	switch {
	case c.n == 0 || c.n > 10_000_000:
		return badFlag("-n %d: onsale wants 1..10000000 buyers", c.n)
	case o.tickets < 1:
		return badFlag("-tickets %d: at least 1", o.tickets)
	case o.abandon < 0 || o.abandon >= 1:
		return badFlag("-abandon %v: in [0, 1)", o.abandon)
	case o.admitRate < 1:
		return badFlag("-admit-rate %d: at least 1", o.admitRate)
	case o.window < time.Second || o.window%time.Second != 0:
		return badFlag("-window %v: whole seconds, at least 1s", o.window)
	case o.perRemaining < 0.001:
		return badFlag("-per-remaining %v: at least 0.001", o.perRemaining)
	case o.soldOutShare > 0.5:
		return badFlag("-sold-out-share %v: at most 0.5", o.soldOutShare)
	case c.sku != "":
		return badFlag("-sku and -scenario onsale: the run makes its own program")
	}
	return nil
}

// setRamp reads -ramp START:END ("": none) into the rates.
func (c *runConfig) setRamp(ramp string) error {
	if ramp == "" {
		return nil
	}
	a, b, ok := strings.Cut(ramp, ":")
	start, err1 := strconv.Atoi(a)
	end, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || start < 1 || end < 1 {
		return badFlag("-ramp %q: want START:END, both at least 1 request per second", ramp)
	}
	if c.rate != 0 {
		return badFlag("-ramp and -rate: give one")
	}
	c.rate, c.rateEnd = start, end
	return nil
}

// checkPace checks how much the run sends and how fast.
func (c *runConfig) checkPace() error {
	switch {
	case c.rate < 0:
		return badFlag("-rate %d: at least 0", c.rate)
	case c.rateEnd > 0 && c.duration <= 0:
		return badFlag("-ramp needs -duration")
	case c.duration < 0:
		return badFlag("-duration %v: at least 0", c.duration)
	case c.n == 0 && c.duration == 0:
		return badFlag("-n 0 runs until -duration: give one")
	case c.workers == 0:
		return badFlag("-workers 0: at least 1")
	case c.skus < 1:
		return badFlag("-skus %d: at least 1", c.skus)
	}
	return nil
}

// checkSKU checks -sku: an existing SKU, for a scenario that can drive one.
func (c *runConfig) checkSKU() error {
	switch {
	case c.sku == "":
		return nil
	case c.scenario == "queue":
		return badFlag("-sku and -scenario queue: the run puts its own program behind a waiting room")
	case c.scenario == "carts":
		return badFlag("-sku and -scenario carts: a cart spans %d SKUs the run creates", len(cartTickets))
	}
	prog, ticket, _ := strings.Cut(c.sku, "/")
	if !isID(prog) || !isID(ticket) {
		return badFlag("-sku %q: want program/ticket, each [A-Za-z0-9_-]{1,64}", c.sku)
	}
	return nil
}

// setIDs checks -run-id and -program, or makes them up.
func (c *runConfig) setIDs() error {
	if c.runID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.runID = hex.EncodeToString(b[:])
	}
	// The longest key is a scenario's prefix, the run id and a request
	// number: keep it inside an id's 64 bytes.
	if !isID(c.runID) || len(c.runID) > 24 {
		return badFlag("-run-id %q: want [A-Za-z0-9_-]{1,24}", c.runID)
	}
	if c.program == "" {
		c.program = fmt.Sprintf("bench%d", time.Now().Unix())
	} else if !isID(c.program) {
		return badFlag("-program %q: want [A-Za-z0-9_-]{1,64}", c.program)
	}
	return nil
}

// isSet reports whether the command line gave the flag.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// isID reports whether s is an id the gateway takes.
func isID(s string) bool {
	_, err := keys.ParseID(s)
	return err == nil
}

// runCmd drives one scenario at a running gateway.
func runCmd(args []string, stdout, stderr io.Writer) error {
	c, err := parseRun(args, stderr)
	if err != nil {
		return err
	}
	if _, err := url.Parse(c.url); err != nil || !strings.HasPrefix(c.url, "http") {
		return badFlag("-url %q: want http(s)://host[:port]", c.url)
	}
	admin := newAdmin(c.url, c.token, c.header, 0)
	if c.scenario == "onsale" {
		return onsaleRun(c, admin, stdout, stderr)
	}
	units, names := c.plan()
	sc := c.load(names)
	if c.sku == "" {
		for _, s := range names {
			if err := admin.putSKU(s, units, c.shards); err != nil {
				return err
			}
		}
	}
	if c.scenario == "queue" {
		return queueRun(c, admin, stdout, stderr)
	}
	res, err := loadgen.Attack(loadgen.Run{Name: c.scenario, BaseURL: c.url, Scenario: sc, Rate: c.rate, RateEnd: c.rateEnd,
		Workers: c.workers, Duration: c.duration, Header: c.header, Progress: stderr, Plot: c.plot})
	if err != nil {
		return err
	}
	out := runSummary{RunID: c.runID, Scenario: c.scenario, SKUs: names, Result: res.Summary()}
	if c.sku != "" {
		out.AuditSkipped = "-sku: the SKU is not the run's own, and its audit needs admin rights"
	} else {
		a := &runAudit{Created: res.Count(http.StatusCreated), SoldOutWindow: res.SoldOutWindow().Seconds()}
		for _, s := range names {
			st, err := admin.sku(s)
			if err != nil {
				return err
			}
			a.SoldHeld, a.Total, a.Shards = a.SoldHeld+st.Sold+st.Held, a.Total+st.Total, max(a.Shards, st.Shards)
		}
		a.Oversold = a.SoldHeld > a.Total
		a.EveryCreatedInLedger = c.scenario == "reads" || a.SoldHeld >= int64(a.Created)*c.ticketsPerRequest()
		out.Audit = a
	}
	if c.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else {
		fmt.Fprint(stdout, loadgen.Table([]loadgen.Result{res}))
		if n := res.Note(); n != "" {
			fmt.Fprintf(stdout, "\n%s\n", n)
		}
		fmt.Fprintf(stdout, "\nrun id %s\n", c.runID)
		if a := out.Audit; a != nil {
			fmt.Fprintf(stdout, "audit: ledger sold+held %d of %d; 201 answers %d; oversold %v; every 201 in the ledger %v\n",
				a.SoldHeld, a.Total, a.Created, a.Oversold, a.EveryCreatedInLedger)
			fmt.Fprintf(stdout, "last 201 after the first 409: %.3fs; unsold at the end: %d; shards at the end: %d\n",
				a.SoldOutWindow, a.Total-a.SoldHeld, a.Shards)
		} else {
			fmt.Fprintf(stdout, "audit skipped (%s)\n", out.AuditSkipped)
		}
	}
	if out.Audit != nil && out.Audit.Oversold {
		return errors.New("OVERSOLD")
	}
	return nil
}

// plan names the SKUs the run drives and the stock it gives the ones it
// creates: a flash sale has a tenth of the run's requests, the others more
// than it sends.
func (c runConfig) plan() (int64, []string) {
	if c.sku != "" {
		return 0, []string{c.sku}
	}
	sku := c.program + "/ga"
	reqs := c.requests()
	switch c.scenario {
	case "flash":
		return int64(max(reqs/10, 1)), []string{sku}
	case "soldout":
		return 0, []string{sku}
	case "reads":
		return 1_000_000, []string{sku}
	case "steady":
		var names []string
		for i := range c.skus {
			names = append(names, fmt.Sprintf("%s/t%d", c.program, i))
		}
		return int64(max(reqs, 1_000_000)), names
	case "carts":
		var names []string
		for _, t := range cartTickets {
			names = append(names, c.program+"/"+t)
		}
		// Every cart takes one of each: every cart is granted.
		return int64(max(reqs, 1_000_000)), names
	}
	return int64(max(reqs, 1_000_000)), []string{sku} // holds
}

// cartTickets are the tickets of a cart run's program; a cart takes one
// of each.
var cartTickets = []string{"adult", "child", "parking"}

// ticketsPerRequest is how many tickets a granted request of the run takes.
func (c runConfig) ticketsPerRequest() int64 {
	if c.scenario == "carts" {
		return int64(len(cartTickets))
	}
	return 1
}

// load is the run's requests at the SKUs. Every key and buyer starts with
// the scenario and the run id, so no two runs share one.
func (c runConfig) load(skus []string) loadgen.Scenario {
	prefix := c.scenario + "-" + c.runID + "-"
	switch c.scenario {
	case "reads":
		return loadgen.Reads(skus[0], c.n)
	case "holds":
		return loadgen.Holds(skus[0], prefix, c.n)
	case "carts":
		return loadgen.Carts(c.program, cartTickets, prefix, c.n)
	}
	return loadgen.Purchases(skus, prefix, c.n)
}

// unknownRequests is what plan assumes of a run only its duration and the
// gateway's speed bound (closed loop, -n 0).
const unknownRequests = 1_000_000

// requests is how many requests the run will send, at most: -n, or what
// its rate (the mean of a ramp) sends over -duration, whichever is less.
func (c runConfig) requests() uint64 {
	if c.rate == 0 || c.duration == 0 {
		if c.n == 0 {
			return unknownRequests
		}
		return c.n
	}
	end := c.rate
	if c.rateEnd > 0 {
		end = c.rateEnd
	}
	paced := uint64(float64(c.rate+end) / 2 * c.duration.Seconds())
	if c.n == 0 {
		return paced
	}
	return min(c.n, paced)
}

// runSummary is `stockbench run -json`.
type runSummary struct {
	RunID        string          `json:"run_id"`
	Scenario     string          `json:"scenario"`
	SKUs         []string        `json:"skus"`
	Result       loadgen.Summary `json:"result"`
	Audit        *runAudit       `json:"audit,omitempty"`
	AuditSkipped string          `json:"audit_skipped,omitempty"`
}

type runAudit struct {
	SoldHeld             int64  `json:"ledger_sold_plus_held"`
	Total                int64  `json:"ledger_total"`
	Created              uint64 `json:"created_answers"`
	Oversold             bool   `json:"oversold"`
	EveryCreatedInLedger bool   `json:"every_201_in_the_ledger"`
	// SoldOutWindow: seconds from the first 409 to the last 201 (a buyer
	// told sold out while others still bought). Shards: the most any of
	// the run's SKUs has at the end.
	SoldOutWindow float64 `json:"sold_out_window_seconds"`
	Shards        int     `json:"shards_at_end"`
}

// adminClient makes the tool's admin calls (SKUs for a run, the audit)
// through the Go client.
type adminClient struct{ c *client.Client }

func newAdmin(base, token string, header http.Header, attempts int) adminClient {
	c, err := client.New(client.Options{BaseURL: base, AdminToken: token, Header: header, Attempts: attempts})
	if err != nil {
		panic(err) // the URLs are the tool's own or checked by parseRun
	}
	return adminClient{c}
}

// skuOf splits "program/ticket".
func skuOf(s string) client.SKU {
	p, t, _ := strings.Cut(s, "/")
	return client.SKU{Program: p, Ticket: t}
}

func (a adminClient) putSKU(sku string, total int64, shards int) error {
	return a.put(sku, client.SKUConfig{Total: &total, Shards: &shards, MaxPerOrder: ptr[int64](4)})
}

// putCapped is putSKU with a per-buyer cap.
func (a adminClient) putCapped(sku string, total int64, shards int, perBuyer int64) error {
	return a.put(sku, client.SKUConfig{Total: &total, Shards: &shards, MaxPerOrder: ptr[int64](4), PerBuyer: &perBuyer})
}

func (a adminClient) put(sku string, cfg client.SKUConfig) error {
	_, err := a.c.PutSKU(context.Background(), skuOf(sku), cfg)
	return err
}

func (a adminClient) sku(sku string) (client.SKUState, error) {
	return a.c.SKUState(context.Background(), skuOf(sku))
}

func ptr[T any](v T) *T { return &v }

// waitReady polls /readyz until it answers 200.
func waitReady(ctx context.Context, base string) error {
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w", base, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
