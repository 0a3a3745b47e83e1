package waitroom_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/waitroom"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// room is the tests' room id.
var room = keys.MustID("room1")

// An early join's position is a keyed permutation of the early joins:
// every position 1..n once, for any n, and not the order of arrival.
func TestPositionsArePermutations(t *testing.T) {
	secret := []byte("s3cret")
	for _, n := range []int64{1, 2, 3, 7, 64, 1000, 4097} {
		seen := make(map[int64]bool, n)
		inOrder := 0
		for i := int64(1); i <= n; i++ {
			p := waitroom.Position(secret, waitroom.Place{Early: true, N: i}, n)
			if p < 1 || p > n || seen[p] {
				t.Fatalf("n=%d: join %d at %d (seen %v)", n, i, p, seen[p])
			}
			seen[p] = true
			if p == i {
				inOrder++
			}
		}
		if n >= 64 && inOrder > int(n)/8 {
			t.Errorf("n=%d: %d early joins kept their arrival place", n, inOrder)
		}
		if got := waitroom.Position(secret, waitroom.Place{N: 5}, n); got != n+5 {
			t.Errorf("late join 5 after %d early ones at %d", n, got)
		}
	}
}

// Tickets and admission tokens are bound to program, buyer and place;
// anything else changed, or another secret, is refused.
func TestTokens(t *testing.T) {
	secret, other := []byte("a"), []byte("b")
	prog, ann, bob := keys.MustID("show"), keys.MustID("ann"), keys.MustID("bob")
	tk := waitroom.Ticket(secret, prog, ann, waitroom.Place{Early: true, N: 7, At: time.Unix(1_800_000_000, 0)})
	if b, p, err := waitroom.ParseTicket(secret, prog, tk); err != nil || b != ann || !p.Early || p.N != 7 || p.At.Unix() != 1_800_000_000 {
		t.Fatalf("ParseTicket = %v %+v %v", b, p, err)
	}
	for _, bad := range []string{tk + "x", tk[:len(tk)-2], "show.ann.early.8.1800000000." + tk[len(tk)-24:], "", "a.b.c.d.e.f"} {
		if _, _, err := waitroom.ParseTicket(secret, prog, bad); !errors.Is(err, waitroom.ErrBadToken) {
			t.Errorf("ParseTicket(%q) = %v", bad, err)
		}
	}
	if _, _, err := waitroom.ParseTicket(other, prog, tk); err == nil {
		t.Error("a ticket under another secret was taken")
	}
	if _, _, err := waitroom.ParseTicket(secret, keys.MustID("show2"), tk); err == nil {
		t.Error("a ticket of another program was taken")
	}
	joined := time.Unix(1_800_000_000, 0)
	adm := waitroom.Admission(secret, prog, ann, 12, joined)
	if pos, at, err := waitroom.ParseAdmission(secret, prog, ann, adm); err != nil || pos != 12 || !at.Equal(joined) {
		t.Fatalf("ParseAdmission = %d %v %v", pos, at, err)
	}
	if _, _, err := waitroom.ParseAdmission(secret, prog, bob, adm); err == nil {
		t.Error("another buyer's admission was taken")
	}
	if _, _, err := waitroom.ParseAdmission(secret, prog, ann, tk); err == nil {
		t.Error("a queue ticket was taken as an admission")
	}
}

// newLine makes a fresh line's record with room for 1,000 places of each
// kind, as the service does from the ledger's facts.
func newLine(t *testing.T, s *waitroom.Store, prog keys.ID) {
	t.Helper()
	ctx := context.Background()
	if made, err := s.Restore(ctx, prog, room, waitroom.Facts{}, time.Now(), time.Minute); err != nil || !made {
		t.Fatalf("Restore = %v %v", made, err)
	}
	for _, early := range []bool{true, false} {
		if err := s.Reserve(ctx, prog, room, early, 1000); err != nil {
			t.Fatal(err)
		}
	}
}

// Joins before the opening are early and fixed at it; a join once the
// line has opened is late, whatever the joiner's clock says; joining again
// is the same place. The pacer admits by the rate, then by the stock
// (admitted-unused <= the limit), closes on sold out; a spent admission is
// one request's, given back only by that request, and expires with the
// window.
func TestLine(t *testing.T) {
	ctx := context.Background()
	s := waitroom.NewStore(testenv.SharedCluster(t).Client())
	prog := keys.MustID(testenv.ID(t, "q"))
	now := time.Now()
	opens := now.Add(time.Hour)
	if _, _, err := s.Join(ctx, prog, room, keys.MustID("e0"), now, opens, nil); !errors.Is(err, waitroom.ErrLost) {
		t.Fatalf("join of a line with no record = %v, want ErrLost", err)
	}
	newLine(t, s, prog)
	for i := range 5 {
		p, created, err := s.Join(ctx, prog, room, keys.MustID(fmt.Sprintf("e%d", i)), now, opens, nil)
		if err != nil || !created || !p.Early || p.N != int64(i+1) || p.At.Unix() != now.Unix() {
			t.Fatalf("early join %d = %+v %v %v", i, p, created, err)
		}
	}
	if p, created, err := s.Join(ctx, prog, room, keys.MustID("e2"), now, opens, nil); err != nil || created || p.N != 3 {
		t.Fatalf("join again = %+v %v %v", p, created, err)
	}
	st, _ := s.State(ctx, prog, room)
	if st.Opened || st.Early != 5 || st.Lost {
		t.Fatalf("before opening: %+v", st)
	}
	// The opening: a join at opens freezes the early count.
	if p, _, err := s.Join(ctx, prog, room, keys.MustID("l0"), opens, opens, nil); err != nil || p.Early || p.N != 1 {
		t.Fatalf("first late join = %+v %v", p, err)
	}
	// A replica whose clock is behind still joins late.
	if p, _, err := s.Join(ctx, prog, room, keys.MustID("l1"), now, opens, nil); err != nil || p.Early || p.N != 2 {
		t.Fatalf("late join with a slow clock = %+v %v", p, err)
	}
	window := time.Minute
	step, err := s.Advance(ctx, prog, room, opens, opens, 3, 100, 0, window, false)
	if err != nil || step.Serving != 3 || step.Joined != 7 || step.Unused != 3 || !step.Opened || step.Early != 5 || step.Late != 2 {
		t.Fatalf("advance by the rate = %+v %v", step, err)
	}
	// The limit: at most 4 admitted unused.
	if step, err = s.Advance(ctx, prog, room, opens.Add(time.Second), opens, 10, 4, 0, window, false); err != nil || step.Serving != 4 {
		t.Fatalf("advance by the stock = %+v %v", step, err)
	}
	at := opens.Add(2 * time.Second)
	e1, e2 := keys.MustID("e1"), keys.MustID("e2")
	if admitted, first, err := s.Spend(ctx, prog, room, 2, e1, keys.MustID("r1"), at, window); err != nil || !first || admitted.UnixMilli() != opens.UnixMilli() {
		t.Fatalf("Spend = %v %v %v", admitted, first, err)
	}
	if _, first, err := s.Spend(ctx, prog, room, 2, e1, keys.MustID("r1"), at, window); err != nil || first {
		t.Fatalf("the same request again: %v %v", first, err)
	}
	if _, _, err := s.Spend(ctx, prog, room, 2, e1, keys.MustID("r2"), at, window); !errors.Is(err, waitroom.ErrSpent) {
		t.Fatalf("another request: %v", err)
	}
	// Only the request that spent it gives it back, once its last copy in
	// flight (r1 passed twice) ends refused.
	settle := func(req string, how waitroom.Outcome, want bool) {
		t.Helper()
		if ok, err := s.Settle(ctx, prog, e1, keys.MustID(req), how); err != nil || ok != want {
			t.Fatalf("Settle(%s, %d) = %v %v, want %v", req, how, ok, err, want)
		}
	}
	settle("r2", waitroom.Refused, false)
	settle("r1", waitroom.Refused, false) // the other copy is still in flight
	settle("r1", waitroom.Refused, true)
	if _, first, err := s.Spend(ctx, prog, room, 2, e1, keys.MustID("r2"), at, window); err != nil || !first {
		t.Fatalf("spend after a release: %v %v", first, err)
	}
	// A copy refused while another committed gives nothing back.
	if _, _, err := s.Spend(ctx, prog, room, 2, e1, keys.MustID("r2"), at, window); err != nil {
		t.Fatal(err)
	}
	// Spent by a request that has not committed: still unused (the
	// ledger counts its ticket as left), so nobody more comes in.
	if step, err = s.Advance(ctx, prog, room, at, opens, 10, 4, 0, window, false); err != nil || step.Serving != 4 || step.Unused != 4 {
		t.Fatalf("advance while a spend is in flight = %+v %v", step, err)
	}
	settle("r2", waitroom.Committed, false)
	settle("r2", waitroom.Refused, false)
	if _, _, err := s.Spend(ctx, prog, room, 2, e1, keys.MustID("r9"), at, window); !errors.Is(err, waitroom.ErrSpent) {
		t.Fatalf("another request after a commit: %v", err)
	}
	if _, _, err := s.Spend(ctx, prog, room, 6, e2, keys.MustID("r3"), at, window); !errors.Is(err, waitroom.ErrNotAdmitted) {
		t.Fatalf("not admitted: %v", err)
	}
	if _, _, err := s.Spend(ctx, prog, room, 1, e2, keys.MustID("r4"), opens.Add(2*window), window); !errors.Is(err, waitroom.ErrExpired) {
		t.Fatalf("expired: %v", err)
	}
	// One bought: one more may come in.
	if step, err = s.Advance(ctx, prog, room, opens.Add(3*time.Second), opens, 10, 4, 0, window, false); err != nil || step.Serving != 5 || step.Unused != 4 {
		t.Fatalf("advance after a spend = %+v %v", step, err)
	}
	// The pacer's floor: counted as 5 unused, a limit of 5 lets nobody in.
	if step, err = s.Advance(ctx, prog, room, opens.Add(3*time.Second), opens, 10, 5, 5, window, false); err != nil || step.Serving != 5 || step.Unused != 4 {
		t.Fatalf("advance with a floor = %+v %v", step, err)
	}
	if step.Cohorts != [3]waitroom.Cohort{} {
		t.Fatalf("cohorts within an eighth of the window: %+v", step.Cohorts)
	}
	// Half the window on: the cohorts let in at least an eighth and a
	// quarter of it ago are places 1-5, half of it ago 1-3 (the batch at
	// the opening); one of them (2) bought.
	if step, err = s.Advance(ctx, prog, room, opens.Add(window/2), opens, 0, 100, 0, window, false); err != nil ||
		step.Cohorts != [3]waitroom.Cohort{{5, 1}, {5, 1}, {3, 1}} {
		t.Fatalf("cohorts = %+v %v", step.Cohorts, err)
	}
	// Past the window, the 4 unspent of the first batches have abandoned.
	if step, err = s.Advance(ctx, prog, room, opens.Add(window+4*time.Second), opens, 10, 100, 0, window, false); err != nil ||
		step.Serving != 7 || step.Abandoned != 4 {
		t.Fatalf("advance after the window = %+v %v", step, err)
	}
	if st, _ := s.State(ctx, prog, room); st.Old != 5 {
		t.Fatalf("admitted before the window: up to %d, want 5", st.Old)
	}
	if step, err = s.Advance(ctx, prog, room, opens.Add(window+5*time.Second), opens, 10, 100, 0, window, true); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.State(ctx, prog, room); !st.SoldOut || !st.Opened || st.Early != 5 || st.Late != 2 {
		t.Fatalf("sold out: %+v", st)
	}
}

// A line hands out places only up to what was reserved, then asks for
// more (ErrFull, naming the kind).
func TestLineFull(t *testing.T) {
	ctx := context.Background()
	s := waitroom.NewStore(testenv.SharedCluster(t).Client())
	prog := keys.MustID(testenv.ID(t, "full"))
	now := time.Now()
	if _, err := s.Restore(ctx, prog, room, waitroom.Facts{}, now, time.Minute); err != nil {
		t.Fatal(err)
	}
	if p, _, err := s.Join(ctx, prog, room, keys.MustID("a"), now, now.Add(time.Hour), nil); !errors.Is(err, waitroom.ErrFull) || !p.Early {
		t.Fatalf("early join with nothing reserved = %+v %v", p, err)
	}
	if err := s.Reserve(ctx, prog, room, false, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve(ctx, prog, room, false, 1); err != nil { // a smaller reservation changes nothing
		t.Fatal(err)
	}
	for _, b := range []string{"a", "b"} {
		if _, _, err := s.Join(ctx, prog, room, keys.MustID(b), now, now, nil); err != nil {
			t.Fatal(err)
		}
	}
	if p, _, err := s.Join(ctx, prog, room, keys.MustID("c"), now, now, nil); !errors.Is(err, waitroom.ErrFull) || p.Early {
		t.Fatalf("third late join with 2 reserved = %+v %v", p, err)
	}
}

// A line Redis lost (or another room's) is made again from the ledger's
// facts: every count past what was reserved, so no place is given twice;
// the places reserved since the pacer last looked are a gap, admitted at
// once and outside the admitted-unused count; those admitted longer ago
// than the window stay expired, the others get a new window; the spends
// the ledger kept are put back; a buyer whose record was lost keeps the
// place of its ticket.
func TestLineRestored(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.SharedCluster(t).Client()
	s := waitroom.NewStore(rdb)
	prog := keys.MustID(testenv.ID(t, "lost"))
	now := time.Now()
	window := time.Minute
	// Another room's line: the restore replaces it whole.
	other := keys.MustID("room0")
	if _, err := s.Restore(ctx, prog, other, waitroom.Facts{Post: 5, Opened: true, Serving: 5}, now, window); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Join(ctx, prog, other, keys.MustID("old"), now, now, &waitroom.Place{N: 3, At: now}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.State(ctx, prog, room); err != nil || !st.Lost {
		t.Fatalf("the state of a room whose line is another room's = %+v %v, want lost", st, err)
	}
	// The ledger saw: 10 early, opened, 20 late joined, 12 served of which
	// 3 longer ago than the window; 30 late places were reserved.
	f := waitroom.Facts{Pre: 16, Opened: true, Early: 10, Post: 30, Serving: 12, Old: 3, GapLo: 10 + 20 + 1, GapHi: 10 + 30}
	if made, err := s.Restore(ctx, prog, room, f, now, window); err != nil || !made {
		t.Fatalf("Restore = %v %v", made, err)
	}
	if made, err := s.Restore(ctx, prog, room, waitroom.Facts{}, now, window); err != nil || made {
		t.Fatalf("a second Restore = %v %v, want nothing changed", made, err)
	}
	// The ledger kept two spends: e4's, and e6's (put back once only).
	spent := []waitroom.Spent{{Buyer: keys.MustID("e4"), Position: 4, Request: keys.MustID("r4")},
		{Buyer: keys.MustID("e6"), Position: 6, Request: keys.MustID("r6")}}
	for range 2 {
		if err := s.Respend(ctx, prog, spent); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Reserve(ctx, prog, room, false, 40); err != nil {
		t.Fatal(err)
	}
	// A new buyer comes after every reserved place; the other room's
	// buyer is a new buyer here.
	if p, _, err := s.Join(ctx, prog, room, keys.MustID("new"), now, now, nil); err != nil || p.Early || p.N != 31 {
		t.Fatalf("join after the restore = %+v %v", p, err)
	}
	if p, created, err := s.Join(ctx, prog, room, keys.MustID("old"), now, now, nil); err != nil || !created || p.N != 32 {
		t.Fatalf("the other room's buyer joins = %+v %v %v", p, created, err)
	}
	// A buyer with a ticket keeps its place.
	kept := waitroom.Place{N: 25, At: now.Add(-time.Minute)}
	if p, created, err := s.Join(ctx, prog, room, keys.MustID("tk"), now, now, &kept); err != nil || created || p.N != 25 || p.Early {
		t.Fatalf("join with a ticket = %+v %v %v", p, created, err)
	}
	if p, _, err := s.Join(ctx, prog, room, keys.MustID("tk"), now, now, nil); err != nil || p.N != 25 {
		t.Fatalf("join again = %+v %v", p, err)
	}
	// Admitted within the window: a new one; before it: expired still;
	// spent before the loss: spent still, by its request only.
	at := now.Add(time.Second)
	if _, _, err := s.Spend(ctx, prog, room, 5, keys.MustID("e5"), keys.MustID("r5"), at, window); err != nil {
		t.Fatalf("spend of a restored admission: %v", err)
	}
	if _, _, err := s.Spend(ctx, prog, room, 2, keys.MustID("e2"), keys.MustID("r2"), at, window); !errors.Is(err, waitroom.ErrExpired) {
		t.Fatalf("spend of an admission expired before the loss: %v", err)
	}
	if _, _, err := s.Spend(ctx, prog, room, 4, keys.MustID("e4"), keys.MustID("x4"), at, window); !errors.Is(err, waitroom.ErrSpent) {
		t.Fatalf("a second spend of an admission spent before the loss: %v", err)
	}
	if _, first, err := s.Spend(ctx, prog, room, 4, keys.MustID("e4"), keys.MustID("r4"), at, window); err != nil || first {
		t.Fatalf("the retry of the request that spent it: %v %v", first, err)
	}
	// e5's request commits (a spend in flight still counts as unused).
	if _, err := s.Settle(ctx, prog, keys.MustID("e5"), keys.MustID("r5"), waitroom.Committed); err != nil {
		t.Fatal(err)
	}
	// 12 served, 3 before the window, 3 bought since: 6 unused; a limit of
	// 10 admits 13..16.
	step, err := s.Advance(ctx, prog, room, now.Add(2*time.Second), now, 100, 10, 0, window, false)
	if err != nil || step.Serving != 16 || step.Unused != 10 || step.Joined != 42 || step.Abandoned != 3 || step.Old != 3 {
		t.Fatalf("advance after the restore = %+v %v", step, err)
	}
	// Then 17..30, the gap 31..40 whole and costing nothing, 41 and 42.
	step, err = s.Advance(ctx, prog, room, now.Add(3*time.Second), now, 100, 100, 0, window, false)
	if err != nil || step.Serving != 42 || step.Unused != 10+16 {
		t.Fatalf("advance over the gap = %+v %v", step, err)
	}
	// Past the window, every unspent place outside the gap has abandoned.
	step, err = s.Advance(ctx, prog, room, now.Add(window+4*time.Second), now, 100, 100, 0, window, false)
	if err != nil || step.Abandoned != 42-10-3 || step.Unused != 0 {
		t.Fatalf("advance after the window = %+v %v", step, err)
	}
}

// What a waiting buyer costs Redis: the line's records after 10,000 joins,
// per buyer (MEMORY USAGE of its keys). A bound, so a change that makes a
// place much dearer shows here.
func TestMemoryPerWaitingBuyer(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.SharedCluster(t).Client()
	s := waitroom.NewStore(rdb)
	prog := keys.MustID(testenv.ID(t, "mem"))
	const n = 10_000
	now := time.Now()
	newLine(t, s, prog)
	if err := s.Reserve(ctx, prog, room, false, n); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, _, err := s.Join(ctx, prog, room, keys.MustID(fmt.Sprintf("buyer-%07d", i)), now, now, nil); err != nil {
			t.Fatal(err)
		}
	}
	k := keys.Queue(prog)
	var bytes int64
	for _, key := range []string{k.Who(), k.Meta()} {
		v, err := rdb.MemoryUsage(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		bytes += v
	}
	per := float64(bytes) / n
	t.Logf("%d waiting buyers (ids of 13 bytes): %d bytes in Redis, %.1f per buyer", n, bytes, per)
	if per > 200 {
		t.Fatalf("%.1f bytes per waiting buyer, want at most 200", per)
	}
}

// BenchmarkLineJoinsOneSlot is what one line's slot takes: joins straight
// to its master from 64 connections, with Redis's own time per join script
// (INFO commandstats of that master). A line lives in one slot; this is
// the rate one master gives it before the gateway's HTTP is in the way
// (docs/BENCHMARKS.md compares it with the gateway's join rate).
func BenchmarkLineJoinsOneSlot(b *testing.B) {
	ctx := context.Background()
	cl := testenv.SharedCluster(b)
	rdb := cl.Client()
	s := waitroom.NewStore(rdb)
	prog := keys.MustID(fmt.Sprintf("bench%d", time.Now().UnixNano()))
	if _, err := s.Restore(ctx, prog, room, waitroom.Facts{}, time.Now(), time.Minute); err != nil {
		b.Fatal(err)
	}
	if err := s.Reserve(ctx, prog, room, false, 1e12); err != nil {
		b.Fatal(err)
	}
	master, err := cl.MasterOf(ctx, keys.KeySlot(keys.Queue(prog).Meta()))
	if err != nil {
		b.Fatal(err)
	}
	mc := master.Client()
	defer mc.Close()
	scriptStats := func() (calls, usec float64) {
		info, _ := mc.Info(ctx, "commandstats").Result()
		for _, l := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_evalsha:"); ok {
				for _, kv := range strings.Split(rest, ",") {
					k, v, _ := strings.Cut(kv, "=")
					f, _ := strconv.ParseFloat(v, 64)
					switch k {
					case "calls":
						calls = f
					case "usec":
						usec = f
					}
				}
			}
		}
		return calls, usec
	}
	var n atomic.Int64
	now := time.Now()
	b.SetParallelism(32) // 64 goroutines on 2 cores
	c0, u0 := scriptStats()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := s.Join(ctx, prog, room, keys.MustID("b"+strconv.FormatInt(n.Add(1), 10)), now, now, nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	c1, u1 := scriptStats()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "joins/s")
	if c1 > c0 {
		per := (u1 - u0) / (c1 - c0)
		b.ReportMetric(per, "redis-µs/join")
		b.ReportMetric(1e6/per, "joins/s-one-master-core")
	}
}

// A line made again says at once which places' windows had passed: a
// check right after a restore (before the pacer's next step) read the old
// count as 0, and an expired buyer as admitted (seen under make test's
// load by e2e/waitroom's TestAttackQueueExpiredRevivedByLoss).
func TestRestoredLineKeepsItsOldPlaces(t *testing.T) {
	ctx := context.Background()
	s := waitroom.NewStore(testenv.SharedCluster(t).Client())
	prog := keys.MustID(testenv.ID(t, "old"))
	room := keys.MustID("room1")
	if made, err := s.Restore(ctx, prog, room, waitroom.Facts{Post: 9, Opened: true, Serving: 7, Old: 4}, time.Now(), time.Minute); err != nil || !made {
		t.Fatalf("restore = %v, %v", made, err)
	}
	st, err := s.State(ctx, prog, room)
	if err != nil || st.Old != 4 || st.Serving != 7 {
		t.Fatalf("state after a restore = %+v, %v; want old 4, serving 7", st, err)
	}
}

// A step or a spend whose clock reads earlier than the restore's (the
// pacer reads the time before it restores the line; another replica's
// clock may be behind) still finds the restored old places expired: the
// pacer's step read 0 and a check answered an expired buyer admitted (CI,
// TestAttackQueueExpiredRevivedByLoss).
func TestRestoredOldPlacesStayExpiredForAnEarlierClock(t *testing.T) {
	ctx := context.Background()
	s := waitroom.NewStore(testenv.SharedCluster(t).Client())
	prog := keys.MustID(testenv.ID(t, "old"))
	room := keys.MustID("room1")
	now := time.Now()
	if made, err := s.Restore(ctx, prog, room, waitroom.Facts{Post: 9, Opened: true, Serving: 7, Old: 4}, now, time.Minute); err != nil || !made {
		t.Fatalf("restore = %v, %v", made, err)
	}
	earlier := now.Add(-50 * time.Millisecond)
	step, err := s.Advance(ctx, prog, room, earlier, earlier.Add(-time.Hour), 0, 100, 0, time.Minute, false)
	if err != nil || step.Old != 4 {
		t.Fatalf("a step with an earlier clock = %+v, %v; want old 4", step, err)
	}
	if st, err := s.State(ctx, prog, room); err != nil || st.Old != 4 {
		t.Fatalf("state after that step = %+v, %v; want old 4", st, err)
	}
	if _, _, err := s.Spend(ctx, prog, room, 4, keys.MustID("ann"), keys.MustID("r1"), earlier, time.Minute); !errors.Is(err, waitroom.ErrExpired) {
		t.Fatalf("spend of an expired place with an earlier clock = %v, want ErrExpired", err)
	}
	if _, first, err := s.Spend(ctx, prog, room, 5, keys.MustID("bob"), keys.MustID("r2"), earlier, time.Minute); err != nil || !first {
		t.Fatalf("spend of a place admitted anew = %v, %v", first, err)
	}
}
