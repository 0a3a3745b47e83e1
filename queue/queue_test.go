package queue_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/queue"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// An early join's position is a keyed permutation of the early joins:
// every position 1..n once, for any n, and not the order of arrival.
func TestPositionsArePermutations(t *testing.T) {
	secret := []byte("s3cret")
	for _, n := range []int64{1, 2, 3, 7, 64, 1000, 4097} {
		seen := make(map[int64]bool, n)
		inOrder := 0
		for i := int64(1); i <= n; i++ {
			p := queue.Position(secret, queue.Place{Early: true, N: i}, n)
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
		if got := queue.Position(secret, queue.Place{N: 5}, n); got != n+5 {
			t.Errorf("late join 5 after %d early ones at %d", n, got)
		}
	}
}

// Tickets and admission tokens are bound to program, buyer and place;
// anything else changed, or another secret, is refused.
func TestTokens(t *testing.T) {
	secret, other := []byte("a"), []byte("b")
	prog, ann, bob := keys.MustID("show"), keys.MustID("ann"), keys.MustID("bob")
	tk := queue.Ticket(secret, prog, ann, queue.Place{Early: true, N: 7})
	if b, p, err := queue.ParseTicket(secret, prog, tk); err != nil || b != ann || !p.Early || p.N != 7 {
		t.Fatalf("ParseTicket = %v %+v %v", b, p, err)
	}
	for _, bad := range []string{tk + "x", tk[:len(tk)-2], "show.ann.early.8." + tk[len(tk)-24:], "", "a.b.c.d.e"} {
		if _, _, err := queue.ParseTicket(secret, prog, bad); !errors.Is(err, queue.ErrBadToken) {
			t.Errorf("ParseTicket(%q) = %v", bad, err)
		}
	}
	if _, _, err := queue.ParseTicket(other, prog, tk); err == nil {
		t.Error("a ticket under another secret was taken")
	}
	if _, _, err := queue.ParseTicket(secret, keys.MustID("show2"), tk); err == nil {
		t.Error("a ticket of another program was taken")
	}
	adm := queue.Admission(secret, prog, ann, 12)
	if pos, err := queue.ParseAdmission(secret, prog, ann, adm); err != nil || pos != 12 {
		t.Fatalf("ParseAdmission = %d %v", pos, err)
	}
	if _, err := queue.ParseAdmission(secret, prog, bob, adm); err == nil {
		t.Error("another buyer's admission was taken")
	}
}

// Joins before the opening are early and fixed at it; a join once the
// line has opened is late, whatever the joiner's clock says; joining again
// is the same place. The pacer admits by the rate, then by the stock
// (admitted-unused <= the limit), closes on sold out; a spent token is
// one request's, and expires with the window.
func TestLine(t *testing.T) {
	ctx := context.Background()
	s := queue.New(testenv.SharedCluster(t).Client())
	prog := keys.MustID(testenv.ID(t, "q"))
	now := time.Now()
	opens := now.Add(time.Hour)
	for i := range 5 {
		p, created, err := s.Join(ctx, prog, keys.MustID(fmt.Sprintf("e%d", i)), now, opens)
		if err != nil || !created || !p.Early || p.N != int64(i+1) {
			t.Fatalf("early join %d = %+v %v %v", i, p, created, err)
		}
	}
	if p, created, err := s.Join(ctx, prog, keys.MustID("e2"), now, opens); err != nil || created || p.N != 3 {
		t.Fatalf("join again = %+v %v %v", p, created, err)
	}
	st, _ := s.State(ctx, prog)
	if st.Opened || st.Early != 5 {
		t.Fatalf("before opening: %+v", st)
	}
	// The opening: a join at opens freezes the early count.
	if p, _, err := s.Join(ctx, prog, keys.MustID("l0"), opens, opens); err != nil || p.Early || p.N != 1 {
		t.Fatalf("first late join = %+v %v", p, err)
	}
	// A replica whose clock is behind still joins late.
	if p, _, err := s.Join(ctx, prog, keys.MustID("l1"), now, opens); err != nil || p.Early || p.N != 2 {
		t.Fatalf("late join with a slow clock = %+v %v", p, err)
	}
	window := time.Minute
	step, err := s.Advance(ctx, prog, opens, opens, 3, 100, window, false)
	if err != nil || step.Serving != 3 || step.Joined != 7 || step.Unused != 3 {
		t.Fatalf("advance by the rate = %+v %v", step, err)
	}
	// The limit: at most 4 admitted unused.
	if step, err = s.Advance(ctx, prog, opens.Add(time.Second), opens, 10, 4, window, false); err != nil || step.Serving != 4 {
		t.Fatalf("advance by the stock = %+v %v", step, err)
	}
	if err := s.Spend(ctx, prog, 2, keys.MustID("r1"), opens.Add(2*time.Second), window); err != nil {
		t.Fatal(err)
	}
	if err := s.Spend(ctx, prog, 2, keys.MustID("r1"), opens.Add(2*time.Second), window); err != nil {
		t.Fatalf("the same request again: %v", err)
	}
	if err := s.Spend(ctx, prog, 2, keys.MustID("r2"), opens.Add(2*time.Second), window); !errors.Is(err, queue.ErrSpent) {
		t.Fatalf("another request: %v", err)
	}
	if err := s.Spend(ctx, prog, 6, keys.MustID("r3"), opens.Add(2*time.Second), window); !errors.Is(err, queue.ErrNotAdmitted) {
		t.Fatalf("not admitted: %v", err)
	}
	if err := s.Spend(ctx, prog, 1, keys.MustID("r4"), opens.Add(2*window), window); !errors.Is(err, queue.ErrExpired) {
		t.Fatalf("expired: %v", err)
	}
	// One spent: one more may come in.
	if step, err = s.Advance(ctx, prog, opens.Add(3*time.Second), opens, 10, 4, window, false); err != nil || step.Serving != 5 {
		t.Fatalf("advance after a spend = %+v %v", step, err)
	}
	// Past the window, the 4 unspent of the first batches have abandoned.
	if step, err = s.Advance(ctx, prog, opens.Add(window+4*time.Second), opens, 10, 100, window, false); err != nil ||
		step.Serving != 7 || step.Abandoned != 4 {
		t.Fatalf("advance after the window = %+v %v", step, err)
	}
	if step, err = s.Advance(ctx, prog, opens.Add(window+5*time.Second), opens, 10, 100, window, true); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.State(ctx, prog); !st.SoldOut || !st.Opened || st.Early != 5 || st.Late != 2 {
		t.Fatalf("sold out: %+v", st)
	}
}

// What a waiting buyer costs Redis: the line's records after 10,000 joins,
// per buyer (MEMORY USAGE of its keys). A bound, so a change that makes a
// place much dearer shows here.
func TestMemoryPerWaitingBuyer(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.SharedCluster(t).Client()
	s := queue.New(rdb)
	prog := keys.MustID(testenv.ID(t, "mem"))
	const n = 10_000
	now := time.Now()
	for i := range n {
		if _, _, err := s.Join(ctx, prog, keys.MustID(fmt.Sprintf("buyer-%07d", i)), now, now); err != nil {
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
