package seats_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/seats"
	"github.com/stockgate/stockgate/stock"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func setup(t *testing.T, n int) (*seats.Store, stock.SKU, []keys.ID) {
	t.Helper()
	rdb := testenv.SharedCluster(t).Client()
	t.Cleanup(func() { rdb.Close() })
	s, err := seats.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	sku := stock.SKU{Program: keys.MustID(testenv.ID(t, "p")), Ticket: keys.MustID("stalls")}
	var m []seats.Seat
	var ids []keys.ID
	for i := range n {
		id := keys.MustID(fmt.Sprintf("A-%d", i+1))
		m = append(m, seats.Seat{ID: id, Section: keys.MustID("A"), Row: "A", Number: i + 1})
		ids = append(ids, id)
	}
	if err := s.Load(context.Background(), sku, m); err != nil {
		t.Fatal(err)
	}
	return s, sku, ids
}

// 500 buyers race for the same 10 seats with overlapping requests of 1 to
// 3 adjacent seats: each seat ends held by at most one hold, every winning
// hold has all its seats, and no losing hold has any.
func TestRaceForTenSeats(t *testing.T) {
	s, sku, ids := setup(t, 10)
	ctx := context.Background()
	type req struct {
		hold  string
		seats []keys.ID
	}
	var mu sync.Mutex
	var won, lost []req
	var wg sync.WaitGroup
	for b := range 500 {
		wg.Go(func() {
			n := 1 + rand.IntN(3)
			start := rand.IntN(len(ids) - n + 1)
			r := req{hold: fmt.Sprintf("h%d", b), seats: ids[start : start+n]}
			err := s.Hold(ctx, sku, keys.MustID("A"), keys.MustID(r.hold), r.seats)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won = append(won, r)
			case errors.Is(err, seats.ErrTaken):
				lost = append(lost, r)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	owner := map[keys.ID]string{}
	for _, r := range won {
		for _, seat := range r.seats {
			if prev, ok := owner[seat]; ok {
				t.Errorf("seat %s won by both %s and %s", seat, prev, r.hold)
			}
			owner[seat] = r.hold
		}
	}
	st, err := s.Status(ctx, sku, keys.MustID("A"), ids)
	if err != nil {
		t.Fatal(err)
	}
	for i, seat := range ids {
		if st[i].Hold != owner[seat] {
			t.Errorf("seat %s held by %q in Redis, %q by the winners", seat, st[i].Hold, owner[seat])
		}
	}
	for _, r := range lost {
		for _, seat := range r.seats {
			if owner[seat] == r.hold {
				t.Errorf("losing hold %s has seat %s", r.hold, seat)
			}
		}
	}
	t.Logf("500 requests: %d holds won (%d seats), %d refused", len(won), len(owner), len(lost))
	if len(won) == 0 || len(won)+len(lost) != 500 {
		t.Errorf("%d won + %d lost", len(won), len(lost))
	}
}

func TestReleaseIsOwnerChecked(t *testing.T) {
	s, sku, ids := setup(t, 4)
	ctx := context.Background()
	if err := s.Hold(ctx, sku, keys.MustID("A"), keys.MustID("mine"), ids[:2]); err != nil {
		t.Fatal(err)
	}
	if err := s.Hold(ctx, sku, keys.MustID("A"), keys.MustID("mine"), ids[:2]); err != nil {
		t.Errorf("retry of the same hold = %v", err)
	}
	var se *seats.SeatError
	if err := s.Hold(ctx, sku, keys.MustID("A"), keys.MustID("theirs"), ids[1:3]); !errors.As(err, &se) || !errors.Is(err, seats.ErrTaken) || len(se.Seats) != 1 || se.Seats[0] != ids[1].String() {
		t.Errorf("overlapping hold = %v, want ErrTaken naming %s", err, ids[1])
	}
	if st, _ := s.Status(ctx, sku, keys.MustID("A"), ids); st[2].Hold != "" {
		t.Errorf("a refused hold took seat %s", ids[2])
	}
	if n, err := s.Release(ctx, sku, keys.MustID("A"), keys.MustID("theirs"), ids[:2]); err != nil || n != 0 {
		t.Errorf("release by another hold id freed %d (%v)", n, err)
	}
	if n, err := s.Sell(ctx, sku, keys.MustID("A"), keys.MustID("mine"), ids[:1]); err != nil || n != 1 {
		t.Errorf("sell = %d, %v", n, err)
	}
	if n, err := s.Release(ctx, sku, keys.MustID("A"), keys.MustID("mine"), ids[:2]); err != nil || n != 1 {
		t.Errorf("release by the owner freed %d (%v), want 1 (the other is sold)", n, err)
	}
	st, _ := s.Status(ctx, sku, keys.MustID("A"), ids[:2])
	if !st[0].Sold || st[0].Hold != "mine" || st[1].Hold != "" {
		t.Errorf("states %+v", st)
	}
	if err := s.Hold(ctx, sku, keys.MustID("A"), keys.MustID("x"), []keys.ID{keys.MustID("Z-9")}); !errors.Is(err, seats.ErrUnknownSeat) {
		t.Errorf("unknown seat = %v", err)
	}
	if err := s.Hold(ctx, sku, keys.MustID("A"), keys.MustID("x"), []keys.ID{ids[3], ids[3]}); !errors.Is(err, stock.ErrInvalid) {
		t.Errorf("repeated seat = %v", err)
	}
	if st, _ := s.Status(ctx, sku, keys.MustID("A"), ids[3:]); st[0].Hold != "" {
		t.Error("a refused request changed a seat")
	}
}

// Best-available on a 20×30 section under 200 concurrent requests for 2 to
// 6 seats: every granted set is adjacent in one row, no seat is granted
// twice, and a single seat is not stranded where it could be avoided.
func TestBestAvailable(t *testing.T) {
	rdb := testenv.SharedCluster(t).Client()
	defer rdb.Close()
	s, err := seats.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	sku := stock.SKU{Program: keys.MustID(testenv.ID(t, "p")), Ticket: keys.MustID("stalls")}
	var m []seats.Seat
	row := map[string]string{}
	num := map[string]int{}
	for r := range 20 {
		for n := range 30 {
			id := fmt.Sprintf("R%02d-S%02d", r+1, n+1)
			m = append(m, seats.Seat{ID: keys.MustID(id), Section: keys.MustID("A"), Row: fmt.Sprintf("R%02d", r+1), Number: n + 1})
			row[id], num[id] = fmt.Sprintf("R%02d", r+1), n+1
		}
	}
	ctx := context.Background()
	if err := s.Load(ctx, sku, m); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	granted := map[keys.ID]string{}
	var sets [][]keys.ID
	byHold := map[string][]keys.ID{}
	var wg sync.WaitGroup
	for b := range 200 {
		wg.Go(func() {
			q := 2 + rand.IntN(5)
			got, err := s.Best(ctx, sku, keys.MustID("A"), keys.MustID(fmt.Sprintf("best-%d", b)), q)
			if errors.Is(err, seats.ErrNoAdjacent) {
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != q {
				t.Errorf("asked for %d, got %v", q, got)
			}
			for _, id := range got {
				if prev, ok := granted[id]; ok {
					t.Errorf("seat %s granted to %s and best-%d", id, prev, b)
				}
				granted[id] = fmt.Sprintf("best-%d", b)
			}
			sets = append(sets, got)
			byHold[fmt.Sprintf("best-%d", b)] = got
		})
	}
	wg.Wait()
	for _, set := range sets {
		for i := 1; i < len(set); i++ {
			if row[set[i].String()] != row[set[0].String()] || num[set[i].String()] != num[set[i-1].String()]+1 {
				t.Errorf("granted set %v is not adjacent in one row", set)
				break
			}
		}
	}
	// Retrying a hold id returns its seats, without taking more.
	for hold, set := range byHold {
		again, err := s.Best(ctx, sku, keys.MustID("A"), keys.MustID(hold), len(set))
		if err != nil || fmt.Sprint(again) != fmt.Sprint(set) {
			t.Errorf("retry of %s = %v, %v; want its seats %v", hold, again, err, set)
		}
		break
	}
	// No stranded single seat: count free runs of length 1 bounded by taken
	// seats on both sides within a row.
	st, _ := s.Status(ctx, sku, keys.MustID("A"), idsOf(m))
	stranded := 0
	for i := range m {
		if st[i].Hold != "" || m[i].Number == 1 || m[i].Number == 30 {
			continue
		}
		if st[i-1].Hold != "" && st[i+1].Hold != "" {
			stranded++
		}
	}
	t.Logf("200 requests: %d sets, %d seats granted; stranded single seats: %d", len(sets), len(granted), stranded)
	if stranded > 0 {
		t.Errorf("%d single seats stranded between taken ones", stranded)
	}
}

func idsOf(m []seats.Seat) []keys.ID {
	out := make([]keys.ID, len(m))
	for i, s := range m {
		out[i] = s.ID
	}
	return out
}

// Rows sort naturally: with rows 1..12 (and Z, AA after them by length),
// best-available fills row 2 before row 10.
func TestBestAvailableRowsInNaturalOrder(t *testing.T) {
	rdb := testenv.SharedCluster(t).Client()
	defer rdb.Close()
	s, err := seats.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	sku := stock.SKU{Program: keys.MustID(testenv.ID(t, "p")), Ticket: keys.MustID("stalls")}
	var m []seats.Seat
	rows := []string{"1", "2", "3", "10", "11", "12", "Z", "AA"}
	for _, r := range rows {
		for n := range 2 {
			m = append(m, seats.Seat{ID: keys.MustID(fmt.Sprintf("r%s-%d", r, n+1)), Section: keys.MustID("A"), Row: r, Number: n + 1})
		}
	}
	ctx := context.Background()
	if err := s.Load(ctx, sku, m); err != nil {
		t.Fatal(err)
	}
	var order []string
	for i := range 3 {
		got, err := s.Best(ctx, sku, keys.MustID("A"), keys.MustID(fmt.Sprintf("h%d", i)), 2)
		if err != nil || len(got) != 2 {
			t.Fatalf("Best = %v, %v", got, err)
		}
		order = append(order, got[0].String())
	}
	if want := []string{"r1-1", "r2-1", "r3-1"}; fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("rows filled in order %v, want %v (2 before 10)", order, want)
	}
}
