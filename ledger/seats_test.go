package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

func seatMap(n int) []ledger.Seat {
	var out []ledger.Seat
	for i := range n {
		out = append(out, ledger.Seat{ID: keys.MustID(fmt.Sprintf("A-%02d", i+1)), Section: keys.MustID("A"), Row: "A", Number: i + 1})
	}
	return out
}

// putStalls makes the seated SKU "stalls" of the test program with n seats
// in section A (A-01...).
func putStalls(t *testing.T, l *ledger.Ledger, n int) stock.SKU {
	t.Helper()
	ctx := context.Background()
	stalls := stock.SKU{Program: sku.Program, Ticket: keys.MustID("stalls")}
	if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: stalls, Total: 0, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.LoadSeats(ctx, stalls, seatMap(n)); err != nil {
		t.Fatal(err)
	}
	return stalls
}

// 500 buyers race for the same 10 seats with overlapping requests: every
// seat held by at most one hold, every hold complete, the SKU's held count
// equal to the seats held.
func TestSeatHoldsRace(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		seats := stock.SKU{Program: sku.Program, Ticket: keys.MustID("stalls")}
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: seats, Total: 0, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		if n, err := l.LoadSeats(ctx, seats, seatMap(10)); err != nil || n != 10 {
			t.Fatalf("LoadSeats = %d, %v", n, err)
		}
		var mu sync.Mutex
		won := map[keys.ID][]keys.ID{}
		var wg sync.WaitGroup
		for b := range 500 {
			wg.Go(func() {
				n := 1 + rand.IntN(3)
				start := rand.IntN(10 - n + 1)
				var ids []keys.ID
				for i := start; i < start+n; i++ {
					ids = append(ids, keys.MustID(fmt.Sprintf("A-%02d", i+1)))
				}
				h, err := l.Hold(ctx, ledger.Hold{IdempotencyKey: keys.MustID(fmt.Sprintf("s%d", b)), SKU: seats, Buyer: keys.MustID(fmt.Sprintf("b%d", b)),
					Quantity: int64(n), SeatIDs: ids, ExpiresAt: c.now().Add(time.Minute)}, -1)
				switch {
				case err == nil:
					mu.Lock()
					won[h.ID] = ids
					mu.Unlock()
				case errors.Is(err, ledger.ErrSeatsTaken):
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		all, err := l.Seats(ctx, seats, keys.MustID("A"))
		if err != nil {
			t.Fatal(err)
		}
		holder := map[keys.ID]keys.ID{}
		for _, s := range all {
			if s.State == "held" {
				holder[s.ID] = s.HoldID
			}
		}
		var seatsWon int
		for id, ids := range won {
			for _, seat := range ids {
				if holder[seat] != id {
					t.Errorf("hold %s won seat %s, which the ledger gives to %q", id, seat, holder[seat])
				}
			}
			seatsWon += len(ids)
		}
		st, _ := l.SKU(ctx, seats)
		if seatsWon != len(holder) || st.Held != int64(seatsWon) || st.Total != 10 {
			t.Errorf("%d seats won, %d held in the map, SKU held %d of %d", seatsWon, len(holder), st.Held, st.Total)
		}
		t.Logf("%d holds won %d seats", len(won), seatsWon)
	})
}

// A seat hold's seats follow it: confirm sells them, cancel and expiry free
// them, a refund of the order frees them; a taken seat is named.
func TestSeatLifecycle(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		seats := stock.SKU{Program: sku.Program, Ticket: keys.MustID("stalls")}
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: seats, Total: 0, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.LoadSeats(ctx, seats, seatMap(6)); err != nil {
			t.Fatal(err)
		}
		hold := func(key string, names ...string) (ledger.Hold, error) {
			ids := make([]keys.ID, len(names))
			for i, s := range names {
				ids[i] = keys.MustID(s)
			}
			return l.Hold(ctx, ledger.Hold{IdempotencyKey: keys.MustID(key), SKU: seats, Buyer: keys.MustID("ann"), Quantity: int64(len(ids)),
				SeatIDs: ids, ExpiresAt: c.now().Add(time.Minute)}, -1)
		}
		state := func() map[string]string {
			all, _ := l.Seats(ctx, seats, keys.ID{})
			out := map[string]string{}
			for _, s := range all {
				out[s.ID.String()] = s.State
			}
			return out
		}
		a, err := hold("a", "A-01", "A-02")
		if err != nil {
			t.Fatal(err)
		}
		var te *ledger.SeatsTakenError
		if _, err := hold("b", "A-02", "A-03"); !errors.As(err, &te) || len(te.Seats) != 1 || te.Seats[0] != "A-02" {
			t.Errorf("overlapping hold = %v, want A-02 named", err)
		}
		if _, err := hold("z", "Z-99"); !errors.Is(err, ledger.ErrSeatsTaken) {
			t.Errorf("unknown seat = %v, want it named as not available", err)
		}
		o, err := l.Confirm(ctx, a.ID, keys.MustID("ann"), ledger.Request{})
		if err != nil {
			t.Fatal(err)
		}
		x, _ := hold("x", "A-03")
		if _, _, err := l.Cancel(ctx, x.ID, keys.MustID("ann"), ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		y, _ := hold("y", "A-04", "A-05")
		c.advance(2 * time.Minute)
		if done, err := l.ExpireDue(ctx, 10); err != nil || len(done) != 1 || done[0].ID != y.ID {
			t.Fatalf("expire = %v, %v", done, err)
		}
		got := state()
		want := map[string]string{"A-01": "sold", "A-02": "sold", "A-03": "free", "A-04": "free", "A-05": "free", "A-06": "free"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("seats %v, want %v", got, want)
		}
		if _, _, err := l.Refund(ctx, o.ID, keys.MustID("ann"), ledger.Request{}); err != nil {
			t.Fatal(err)
		}
		if got := state(); got["A-01"] != "free" || got["A-02"] != "free" {
			t.Errorf("after the refund %v", got)
		}
		if st, _ := l.SKU(ctx, seats); st.Sold != 0 || st.Held != 0 {
			t.Errorf("SKU %+v, want nothing sold or held", st)
		}
	})
}

// Seat holds group-commit with the rest of a batch: each takes all its
// seats or is split out alone, where it learns which seats it could not
// have; the others keep theirs, a purchase beside them commits, and a
// batched seat hold reads as one taken alone (its seats, its take epoch).
func TestBatchedSeatHolds(t *testing.T) {
	eachDriverClock(t, func(t *testing.T, l *ledger.Ledger, c *clock) {
		ctx := context.Background()
		stalls := putStalls(t, l, 8)
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: sku, Total: 5, Shards: 1, MaxPerOrder: 4}); err != nil {
			t.Fatal(err)
		}
		st, err := l.AdvanceGate(ctx, stalls) // epoch 1: a seat hold takes the row's epoch
		if err != nil {
			t.Fatal(err)
		}
		seatHold := func(key, buyer string, seats ...string) ledger.Hold {
			var ids []keys.ID
			for _, s := range seats {
				ids = append(ids, keys.MustID(s))
			}
			return ledger.Hold{IdempotencyKey: keys.MustID("row-" + key), SKU: stalls, Buyer: keys.MustID(buyer), Quantity: int64(len(ids)),
				SeatIDs: ids, ExpiresAt: c.now().Add(time.Minute), Gate: "seats:A:" + strings.Join(seats, ","), GateEpoch: -1,
				Req: req(buyer, key, "seats "+strings.Join(seats, ","), ledger.OpSeatHold)}
		}
		if _, err := l.Hold(ctx, seatHold("earlier", "eve", "A-04"), -1); err != nil {
			t.Fatal(err)
		}
		batch := []ledger.Take{
			ledger.HoldTake(seatHold("x", "xan", "A-01", "A-02")),
			ledger.HoldTake(seatHold("y", "yul", "A-02", "A-03")), // A-02 is x's
			ledger.HoldTake(seatHold("z", "zoe", "A-04")),         // eve's
			ledger.HoldTake(seatHold("w", "wes", "A-05")),
			ledger.HoldTake(seatHold("u", "uma", "A-99")), // not in the map
			ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID("row-p"), SKU: sku, Buyer: keys.MustID("pat"), Quantity: 1}),
		}
		res := l.Commit(ctx, batch, false)
		for i, want := range map[int][]string{1: {"A-02"}, 2: {"A-04"}, 4: {"A-99"}} {
			var te *ledger.SeatsTakenError
			if !errors.As(res[i].Err, &te) || !slices.Equal(te.Seats, want) {
				t.Errorf("take %d = %v; want seats %v taken", i, res[i].Err, want)
			}
		}
		for _, i := range []int{0, 3, 5} {
			if res[i].Err != nil {
				t.Errorf("take %d = %v, want committed", i, res[i].Err)
			}
		}
		x, w := res[0].Hold(), res[3].Hold()
		for _, h := range []ledger.Hold{x, w} {
			row, err := l.HoldByID(ctx, h.ID)
			if err != nil || row.State != ledger.Held || len(row.SeatIDs) != int(h.Quantity) || row.TakeEpoch != st.GateEpoch {
				t.Errorf("batched seat hold row = %+v, %v; want held with its seats at take epoch %d", row, err, st.GateEpoch)
			}
		}
		want := map[string]string{"A-01": x.ID.String(), "A-02": x.ID.String(), "A-05": w.ID.String()}
		for _, s := range mustSeats(t, l, stalls) {
			switch {
			case want[s.ID.String()] != "" && (s.State != "held" || s.HoldID.String() != want[s.ID.String()]):
				t.Errorf("seat %s is %s by %q, want held by %s", s.ID, s.State, s.HoldID, want[s.ID.String()])
			case want[s.ID.String()] == "" && s.ID.String() != "A-04" && s.State != "free":
				t.Errorf("seat %s is %s, want free", s.ID, s.State)
			}
		}
		if got, _ := l.SKU(ctx, stalls); got.Held != 4 { // x 2, w 1, eve 1
			t.Errorf("stalls held %d, want 4", got.Held)
		}
		// Alone, each split one learns its seats.
		for i, taken := range map[int]string{1: "A-02", 2: "A-04", 4: "A-99"} {
			var te *ledger.SeatsTakenError
			if _, err := l.Hold(ctx, batch[i].Holds[0], -1); !errors.As(err, &te) || strings.Join(te.Seats, ",") != taken {
				t.Errorf("take %d alone = %v, want seats %s taken", i, err, taken)
			}
		}
		// A cancelled batched seat hold frees its seats.
		if r, err := l.CancelBatch(ctx, []ledger.HoldRequest{{HoldID: x.ID, Buyer: x.Buyer, Req: req("xan", "cx", "cancel", ledger.OpCancel)}}); err != nil || r[0].Err != nil {
			t.Fatalf("cancel = %+v, %v", r, err)
		}
		for _, s := range mustSeats(t, l, stalls) {
			if (s.ID.String() == "A-01" || s.ID.String() == "A-02") && s.State != "free" {
				t.Errorf("seat %s is %s after its hold was cancelled", s.ID, s.State)
			}
		}
	})
}
