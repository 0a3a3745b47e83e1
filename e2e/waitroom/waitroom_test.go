package waitroom_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

type queueReply struct {
	Ticket    string `json:"ticket"`
	State     string `json:"state"`
	Position  int64  `json:"position"`
	Ahead     *int64 `json:"ahead"`
	Admission string `json:"admission_token"`
}

// roomState is the admin's view of a room and its line (GET
// /v1/admin/programs/{program}/queue).
type roomState struct {
	PowBits      int       `json:"proof_of_work_bits"`
	SoldOutShare float64   `json:"sold_out_share"`
	Conversion   float64   `json:"conversion"`
	JoinFrom     time.Time `json:"join_from"`
	Checkout     string    `json:"checkout_url"`
	Joined       int64     `json:"joined"`
	Serving      int64     `json:"serving"`
	Unused       int64     `json:"admitted_unused"`
	Abandoned    int64     `json:"abandoned"`
	SoldOut      bool      `json:"sold_out"`
}

func getRoom(t *testing.T, e *systest.Env, program keys.ID) roomState {
	t.Helper()
	r := e.Do(t, http.MethodGet, "/v1/admin/programs/"+program.String()+"/queue", nil, "")
	var v roomState
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &v) != nil {
		t.Fatalf("GET queue = %d %s", r.Status, r.Body)
	}
	return v
}

func queueJoin(t *testing.T, e *systest.Env, program keys.ID, buyer string) (systest.Reply, queueReply) {
	r := e.Do(t, http.MethodPost, "/v1/programs/"+program.String()+"/queue", nil, fmt.Sprintf(`{"buyer":%q}`, buyer))
	var q queueReply
	_ = json.Unmarshal(r.Body, &q)
	return r, q
}

func queueCheck(t *testing.T, e *systest.Env, program keys.ID, ticket string) (systest.Reply, queueReply) {
	r := e.Do(t, http.MethodGet, "/v1/programs/"+program.String()+"/queue/"+ticket, nil, "")
	var q queueReply
	_ = json.Unmarshal(r.Body, &q)
	return r, q
}

func buyAdmitted(t *testing.T, e *systest.Env, sku stock.SKU, key, buyer, token string) systest.Reply {
	return e.Do(t, http.MethodPost, "/v1/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/purchases",
		map[string]string{"Idempotency-Key": key, "Admission-Token": token}, fmt.Sprintf(`{"buyer":%q,"quantity":1}`, buyer))
}

// 120 buyers in the waiting room of 20 tickets on two replicas (each
// running the pacer; one paces at a time), a third of those admitted
// walking away: every ticket sold, each only with a spent token; buyers
// admitted in place order, never more waiting to buy than the tickets
// left allow; once sold out, nobody admitted and every waiting buyer told
// so; tokens forged, another buyer's, reused or missing refused with
// their problem, moving nothing.
func TestQueueAdmitsInOrderUntilSoldOut(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	systest.EachDriver(t, func(t *testing.T, driver string) {
		dsn := systest.LedgerDSN(t, driver)
		a := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Pacer: true})
		b := systest.Start(t, systest.Options{Driver: driver, DSN: dsn, Pacer: true})
		sku := systest.NewSKU(t)
		const total, buyers = 20, 120
		a.PutSKU(t, sku, total, 2, 4)
		if r := a.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String()+"/queue", nil,
			`{"opens_in_seconds":0,"rate_per_second":200,"window_seconds":6,"per_remaining":1}`); r.Status != http.StatusOK {
			t.Fatalf("PUT queue = %d %s", r.Status, r.Body)
		}
		// Without a token, nothing sells.
		if r := a.Buy(t, sku, "no-token", "x", 1); r.Status != http.StatusForbidden || systest.ProblemKind(r) != "admission-required" {
			t.Fatalf("purchase without admission = %d %s", r.Status, r.Body)
		}
		tickets := make([]string, buyers)
		positions := map[int64]int{}
		lastPos := make([]int64, buyers) // where each buyer last stood
		for i := range buyers {
			e := []*systest.Env{a, b}[i%2]
			r, q := queueJoin(t, e, sku.Program, fmt.Sprintf("u%d", i))
			if r.Status != http.StatusCreated || q.Ticket == "" {
				t.Fatalf("join %d = %d %s", i, r.Status, r.Body)
			}
			tickets[i] = q.Ticket
			lastPos[i] = q.Position
			if q.State != "admitted" {
				positions[q.Position]++
			}
		}
		if r, q := queueJoin(t, b, sku.Program, "u7"); r.Status != http.StatusOK || q.Ticket != tickets[7] {
			t.Fatalf("join again = %d %s", r.Status, r.Body)
		}
		// Forged and altered tickets.
		for _, bad := range []string{"nope", tickets[3] + "x", strings.Replace(tickets[3], "u3", "u4", 1)} {
			if r, _ := queueCheck(t, a, sku.Program, bad); r.Status != http.StatusBadRequest || systest.ProblemKind(r) != "invalid-queue-ticket" {
				t.Errorf("check of %q = %d %s", bad, r.Status, r.Body)
			}
		}
		ctx := context.Background()
		var mu sync.Mutex
		sold, walked := 0, 0
		admittedAt := map[int]int64{} // buyer → position admitted at
		forgedTried := false
		// A 6 s window: with 3 s, a make test whose failover tests ran
		// beside this one made passes so slow that 110 of 120 admitted
		// buyers expired unseen and the line ran out with 10 unsold. A
		// walk-away holds its place a window long, so the sale takes a
		// few windows.
		deadline := time.Now().Add(120 * time.Second)
		for {
			if time.Now().After(deadline) {
				t.Fatalf("sold %d of %d after 120s", sold, total)
			}
			done := true
			// Buyers in line order, and a pass ends at the tenth still
			// waiting: the line admits in order, so those behind wait too.
			// A pass over all 120 under -race on a busy machine took
			// longer than the window, and admitted buyers expired
			// unseen until the line ran out of buyers before tickets.
			order := make([]int, buyers)
			for i := range order {
				order[i] = i
			}
			slices.SortStableFunc(order, func(x, y int) int { return cmp.Compare(lastPos[x], lastPos[y]) })
			waiting := 0
			for _, i := range order {
				if _, ok := admittedAt[i]; ok {
					continue
				}
				if waiting == 10 {
					break
				}
				e := []*systest.Env{a, b}[i%2]
				r, q := queueCheck(t, e, sku.Program, tickets[i])
				if r.Status != http.StatusOK {
					t.Fatalf("check %d = %d %s", i, r.Status, r.Body)
				}
				lastPos[i] = q.Position
				switch q.State {
				case "waiting":
					done = false
					waiting++
					if r.Header.Get("Retry-After") == "" {
						t.Fatalf("waiting without Retry-After: %s", r.Body)
					}
				case "admitted":
					admittedAt[i] = q.Position
					buyer := fmt.Sprintf("u%d", i)
					if !forgedTried {
						forgedTried = true
						other := fmt.Sprintf("u%d", (i+1)%buyers)
						if r := buyAdmitted(t, e, sku, "f-"+buyer, other, q.Admission); r.Status != http.StatusForbidden || systest.ProblemKind(r) != "admission-invalid" {
							t.Fatalf("another buyer's token = %d %s", r.Status, r.Body)
						}
						if r := buyAdmitted(t, e, sku, "g-"+buyer, buyer, q.Admission[:len(q.Admission)-3]+"AAA"); r.Status != http.StatusForbidden {
							t.Fatalf("forged token = %d %s", r.Status, r.Body)
						}
					}
					if i%3 == 0 {
						walked++ // abandons
						continue
					}
					r := buyAdmitted(t, e, sku, "k-"+buyer, buyer, q.Admission)
					switch r.Status {
					case http.StatusCreated:
						mu.Lock()
						sold++
						mu.Unlock()
						if r2 := buyAdmitted(t, e, sku, "k2-"+buyer, buyer, q.Admission); r2.Status != http.StatusConflict || systest.ProblemKind(r2) != "admission-used" {
							t.Fatalf("second order on one token = %d %s", r2.Status, r2.Body)
						}
						if r3 := buyAdmitted(t, e, sku, "k-"+buyer, buyer, q.Admission); r3.Status != http.StatusCreated || r3.Header.Get("Idempotent-Replayed") != "true" {
							t.Fatalf("retry of the order = %d %s", r3.Status, r3.Body)
						}
					case http.StatusConflict:
						if systest.ProblemKind(r) != "sold-out" {
							t.Fatalf("admitted purchase = %d %s", r.Status, r.Body)
						}
					case http.StatusGone:
						// Admitted longer ago than the window: one pass
						// over 120 buyers under -race on a busy machine can
						// take that long. As good as walking away; the
						// room admits others in its place.
						if systest.ProblemKind(r) != "admission-expired" {
							t.Fatalf("admitted purchase = %d %s", r.Status, r.Body)
						}
						walked++
					default:
						t.Fatalf("admitted purchase = %d %s", r.Status, r.Body)
					}
				case "expired":
					// Admitted, and the window passed before this buyer
					// looked (a pass over 120 buyers under -race on a busy
					// machine is slower than the window): as good as
					// walking away, as a 410 on the purchase is below.
					admittedAt[i] = q.Position
					walked++
				case "sold-out":
				default:
					t.Fatalf("check %d: %s", i, r.Body)
				}
			}
			if done {
				break
			}
		}
		st, err := a.Ledger.SKU(ctx, sku)
		if err != nil || st.Sold != total || sold != total {
			t.Fatalf("sold %d (ledger: sold %d held %d of %d, %v), want %d; %d walked away, %d admitted",
				sold, st.Sold, st.Held, st.Total, err, total, walked, len(admittedAt))
		}
		// Admitted in place order (every admitted place at or under the
		// serving counter, every place told sold-out above it), never more
		// than sold + walked away + the slack (per_remaining x tickets).
		var q struct {
			Serving, Joined int64
			SoldOut         bool `json:"sold_out"`
		}
		r := a.Do(t, http.MethodGet, "/v1/admin/programs/"+sku.Program.String()+"/queue", nil, "")
		if err := json.Unmarshal(r.Body, &q); err != nil || r.Status != http.StatusOK {
			t.Fatalf("GET queue = %d %s", r.Status, r.Body)
		}
		// A place admitted in the pacer's last step before the sold-out is
		// told sold-out (nothing is left to buy), so it may never have
		// been seen admitted.
		if !q.SoldOut || q.Joined != buyers || int(q.Serving) < len(admittedAt) || int(q.Serving) > total+walked+total {
			t.Fatalf("queue %+v: %d admitted, %d sold, %d walked away", q, len(admittedAt), sold, walked)
		}
		for i, pos := range admittedAt {
			if pos > q.Serving {
				t.Fatalf("buyer %d admitted at %d past serving %d", i, pos, q.Serving)
			}
		}
		for pos, n := range positions {
			if n != 1 && pos != 0 {
				t.Fatalf("position %d given %d times", pos, n)
			}
		}
		// Nobody admitted after the sold-out: every other buyer still reads
		// sold-out, and the counter has not moved. A place at or under it
		// was admitted in the pacer's last step and told sold-out before
		// the buyer looked (seen under load: position 30 of 32); there are
		// no more of those than the counter leaves.
		unseen := 0
		for i := range buyers {
			if _, ok := admittedAt[i]; ok {
				continue
			}
			r, got := queueCheck(t, []*systest.Env{a, b}[i%2], sku.Program, tickets[i])
			if r.Status != http.StatusOK || got.State != "sold-out" || got.Position <= 0 {
				t.Fatalf("buyer %d after the sold-out: %d %s (serving %d)", i, r.Status, r.Body, q.Serving)
			}
			if got.Position <= q.Serving {
				unseen++
			}
		}
		if len(admittedAt)+unseen != int(q.Serving) {
			t.Fatalf("%d seen admitted and %d admitted unseen, serving %d", len(admittedAt), unseen, q.Serving)
		}
		r2 := b.Do(t, http.MethodGet, "/v1/admin/programs/"+sku.Program.String()+"/queue", nil, "")
		var q2 struct{ Serving int64 }
		_ = json.Unmarshal(r2.Body, &q2)
		if q2.Serving != q.Serving {
			t.Fatalf("serving moved from %d to %d after the sold-out", q.Serving, q2.Serving)
		}
		t.Logf("%d buyers, %d tickets: %d admitted (%d told sold-out first), %d walked away, %d sold", buyers, total, q.Serving, unseen, walked, sold)
	})
}

// An admission token lapses with its window: a purchase after it gets 410
// admission-expired and moves nothing; a token of another program, or a
// program's purchase with a token when its room is turned off, behave as
// documented.
func TestQueueAdmissionExpires(t *testing.T) {
	t.Parallel() // its own env and programs: it overlaps the others' waits
	e := systest.Start(t, systest.Options{Driver: "sqlite", Pacer: true})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 5, 1, 4)
	path := "/v1/admin/programs/" + sku.Program.String() + "/queue"
	if r := e.Do(t, http.MethodPut, path, nil, `{"opens_in_seconds":0,"rate_per_second":100,"window_seconds":1,"per_remaining":2}`); r.Status != http.StatusOK {
		t.Fatalf("PUT queue = %d %s", r.Status, r.Body)
	}
	_, q := queueJoin(t, e, sku.Program, "ann")
	var seen time.Time
	systest.WaitFor(t, 10*time.Second, "ann admitted", func() bool {
		_, q = queueCheck(t, e, sku.Program, q.Ticket)
		seen = time.Now()
		return q.State == "admitted"
	})
	// Admitted at or before seen: the window is over a second after it.
	for time.Now().Before(seen.Add(1200 * time.Millisecond)) {
		time.Sleep(50 * time.Millisecond) // time under test: the 1 s admission window lapses
	}
	if r := buyAdmitted(t, e, sku, "late", "ann", q.Admission); r.Status != http.StatusGone || systest.ProblemKind(r) != "admission-expired" {
		t.Fatalf("purchase after the window = %d %s", r.Status, r.Body)
	}
	if st := e.State(t, sku); st.Sold != 0 || st.RedisRemaining != 5 {
		t.Fatalf("an expired token moved stock: %+v", st)
	}
	// Turned off: the program sells without admission.
	if r := e.Do(t, http.MethodDelete, path, nil, ""); r.Status != http.StatusNoContent {
		t.Fatalf("DELETE queue = %d %s", r.Status, r.Body)
	}
	systest.WaitFor(t, 5*time.Second, "a purchase without admission", func() bool {
		return e.Buy(t, sku, fmt.Sprintf("free-%d", time.Now().UnixNano()), "bob", 1).Status == http.StatusCreated
	})
	if r := e.Do(t, http.MethodGet, path, nil, ""); r.Status != http.StatusNotFound || systest.ProblemKind(r) != "no-queue" {
		t.Fatalf("GET of a deleted queue = %d %s", r.Status, r.Body)
	}
	// Bad settings are refused with their problem.
	for _, body := range []string{`{"rate_per_second":1,"window_seconds":1,"per_remaining":1}`,
		`{"opens_in_seconds":0,"rate_per_second":0,"window_seconds":1,"per_remaining":1}`,
		`{"opens_in_seconds":0,"rate_per_second":1,"window_seconds":0,"per_remaining":1}`,
		`{"opens_in_seconds":0,"rate_per_second":1,"window_seconds":1,"per_remaining":0}`,
		`{"opens_in_seconds":0,"rate_per_second":1,"window_seconds":1,"per_remaining":1,"checkout_url":"javascript:alert(1)"}`,
		`{"opens_in_seconds":-5,"rate_per_second":1,"window_seconds":1,"per_remaining":1}`} {
		if r := e.Do(t, http.MethodPut, path, nil, body); r.Status != http.StatusUnprocessableEntity {
			t.Errorf("PUT queue %s = %d %s", body, r.Status, r.Body)
		}
	}
}

// hmgets counts the HMGET calls the cluster's masters have served (a
// line's counters are read with one).
func hmgets(t *testing.T, e *systest.Env) int64 {
	t.Helper()
	var n int64
	err := e.Redis.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_hmget:calls="); ok {
				calls, _, _ := strings.Cut(rest, ",")
				v, _ := strconv.ParseInt(calls, 10, 64)
				atomic.AddInt64(&n, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Checking one's place costs no Redis call: 10,000 checks from 32 clients
// read the line from Redis only when the replica's memory of it is due
// (every 250 ms), whoever asks.
func TestQueuePollsCostNoRedisCall(t *testing.T) {
	e := systest.Start(t, systest.Options{Driver: "sqlite"}) // no pacer: the line holds still
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 5, 1, 4)
	if r := e.Do(t, http.MethodPut, "/v1/admin/programs/"+sku.Program.String()+"/queue", nil,
		`{"opens_in_seconds":0,"rate_per_second":10,"window_seconds":60,"per_remaining":1}`); r.Status != http.StatusOK {
		t.Fatalf("PUT queue = %d %s", r.Status, r.Body)
	}
	var tickets []string
	for i := range 32 {
		_, q := queueJoin(t, e, sku.Program, fmt.Sprintf("w%d", i))
		tickets = append(tickets, q.Ticket)
	}
	const polls = 10000
	before, start := hmgets(t, e), time.Now()
	counts := systest.BuyAll(polls, 32, func(i int) systest.Reply {
		r, _ := queueCheck(t, e, sku.Program, tickets[i%len(tickets)])
		return r
	})
	elapsed := time.Since(start)
	calls := hmgets(t, e) - before
	if counts[http.StatusOK] != polls {
		t.Fatalf("checks: %v", counts)
	}
	// One read per refresh period at most (and one more for a period
	// started at the edge).
	if bound := int64(elapsed/(250*time.Millisecond)) + 2; calls > bound {
		t.Fatalf("%d checks in %v made %d line reads, want at most %d (one per 250 ms)", polls, elapsed, calls, bound)
	}
	t.Logf("%d checks in %v: %d line reads from Redis (%.4f per check)", polls, elapsed.Round(time.Millisecond), calls, float64(calls)/polls)
}
