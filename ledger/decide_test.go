package ledger

import (
	"errors"
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// The take batch's decisions that need no database: which takes of a
// batch go on (within), and what the rows a careful attempt read refuse
// (decide), taken in turn as if each committed. These run in the unit
// tier; the ledger's tests on SQLite and PostgreSQL hold the statements
// to the same answers.

var (
	unitSKU   = stock.SKU{Program: keys.MustID("p"), Ticket: keys.MustID("t")}
	unitOther = stock.SKU{Program: keys.MustID("p"), Ticket: keys.MustID("u")}
)

func unitOrder(key, buyer string, sku stock.SKU, q int64) Order {
	return Order{SKU: sku, Buyer: keys.MustID(buyer), Quantity: q, IdempotencyKey: keys.MustID(key), GateEpoch: -1}
}

// batchOf is a batch of takes, each its own request of its order's key.
func batchOf(takes ...Take) *takeBatch {
	return &takeBatch{takes: takes, res: make([]TakeResult, len(takes))}
}

func purchase(o Order) Take {
	return Take{Req: Request{Scope: o.Buyer, Key: o.IdempotencyKey}, Orders: []Order{o}}
}

// decideAll runs decide over every take of b against rows.
func decideAll(b *takeBatch, rows map[stock.SKU]skuRow, buyers map[buyerName][2]int64, codes map[codeName]codeRow) map[int]bool {
	var kept []int
	var lines []tline
	for i := range b.takes {
		kept = append(kept, i)
		lines = append(lines, b.lines(i)...)
	}
	return b.decide(kept, lines, rows, buyers, codes)
}

func TestDecideTakesInTurn(t *testing.T) {
	open := func(total, sold int64) skuRow { return skuRow{total: total, sold: sold, epoch: 7} }
	for _, c := range []struct {
		name  string
		takes []Take
		rows  map[stock.SKU]skuRow
		want  []error // each take's refusal (nil: passes)
	}{
		{name: "in turn until none is left",
			takes: []Take{purchase(unitOrder("k1", "ann", unitSKU, 2)), purchase(unitOrder("k2", "bob", unitSKU, 2)), purchase(unitOrder("k3", "cat", unitSKU, 1))},
			rows:  map[stock.SKU]skuRow{unitSKU: open(5, 2)},
			want:  []error{nil, stock.ErrSoldOut, nil}},
		{name: "unknown", takes: []Take{purchase(unitOrder("k1", "ann", unitOther, 1))},
			rows: map[stock.SKU]skuRow{unitSKU: open(5, 0)}, want: []error{stock.ErrUnknownSKU}},
		{name: "ended before sold out", takes: []Take{purchase(unitOrder("k1", "ann", unitSKU, 9))},
			rows: map[stock.SKU]skuRow{unitSKU: {total: 5, ended: true}}, want: []error{stock.ErrSaleEnded}},
		{name: "counted units of a seated ticket", takes: []Take{purchase(unitOrder("k1", "ann", unitSKU, 1))},
			rows: map[stock.SKU]skuRow{unitSKU: {total: 5, seated: true}}, want: []error{ErrSeatedTake}},
		{name: "a gate rebuilt since",
			takes: []Take{purchase(func() Order { o := unitOrder("k1", "ann", unitSKU, 1); o.GateEpoch = 6; return o }()),
				purchase(func() Order { o := unitOrder("k2", "bob", unitSKU, 1); o.GateEpoch = 7; return o }())},
			rows: map[stock.SKU]skuRow{unitSKU: open(5, 0)}, want: []error{ErrStaleGate, nil}},
		{name: "a row moved since a take around the gate was decided",
			takes: []Take{{Req: Request{Scope: keys.MustID("ann"), Key: keys.MustID("k1")}, Orders: []Order{unitOrder("k1", "ann", unitSKU, 1)}, version: 3, versioned: true}},
			rows:  map[stock.SKU]skuRow{unitSKU: {total: 5, version: 4}}, want: []error{ErrConflict}},
		// A cart is all or nothing: its second line finds too little left,
		// and the refusal names it; the take after it still gets the stock.
		{name: "a cart refused by its second line",
			takes: []Take{
				{Req: Request{Scope: keys.MustID("ann"), Key: keys.MustID("c1")}, Cart: &Cart{},
					Orders: []Order{unitOrder("c1a", "ann", unitSKU, 1), unitOrder("c1b", "ann", unitOther, 3)}},
				purchase(unitOrder("k2", "bob", unitSKU, 3))},
			rows: map[stock.SKU]skuRow{unitSKU: open(3, 0), unitOther: open(2, 0)},
			want: []error{&LineError{Line: 1, Err: stock.ErrSoldOut}, nil}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := batchOf(c.takes...)
			refused := decideAll(b, c.rows, nil, nil)
			for i, want := range c.want {
				got := b.res[i].Err
				if (want == nil) != !refused[i] || !sameRefusal(got, want) {
					t.Fatalf("take %d: refused %v with %v, want %v", i, refused[i], got, want)
				}
			}
		})
	}
}

// sameRefusal: got is want, a cart's naming the same line.
func sameRefusal(got, want error) bool {
	var gl, wl *LineError
	if errors.As(want, &wl) {
		return errors.As(got, &gl) && gl.Line == wl.Line && errors.Is(got, wl.Err)
	}
	return errors.Is(got, want) || got == want
}

func TestDecideCapsAndCodesInTurn(t *testing.T) {
	rows := map[stock.SKU]skuRow{unitSKU: {total: 100}}
	ann := keys.MustID("ann")
	// ann owns 2 of a ticket capped at 4 and 5 of the program's 6.
	buyers := map[buyerName][2]int64{
		{unitSKU.Program, unitSKU.Ticket, ann}: {2, 4},
		{unitSKU.Program, keys.ID{}, ann}:      {5, 6},
	}
	b := batchOf(purchase(unitOrder("k1", "ann", unitSKU, 1)), purchase(unitOrder("k2", "ann", unitSKU, 1)),
		purchase(unitOrder("k3", "bob", unitSKU, 3)))
	refused := decideAll(b, rows, buyers, nil)
	if refused[0] || !refused[1] || refused[2] {
		t.Fatalf("refused %v, want the second of ann's only (the program's cap, after the first)", refused)
	}
	var le *LineError
	if !errors.Is(b.res[1].Err, stock.ErrLimit) || errors.As(b.res[1].Err, &le) {
		t.Fatalf("second take: %v, want the cap's refusal", b.res[1].Err)
	}

	code := func(key, buyer string) Order { o := unitOrder(key, buyer, unitSKU, 1); o.CodeHash = "h1"; return o }
	codes := map[codeName]codeRow{{unitSKU, "h1"}: {maxUses: 2, uses: 1}}
	b = batchOf(purchase(code("k1", "ann")), purchase(code("k2", "bob")),
		purchase(func() Order { o := unitOrder("k3", "cat", unitSKU, 1); o.CodeHash = "nope"; return o }()))
	refused = decideAll(b, rows, nil, codes)
	if refused[0] || !errors.Is(b.res[1].Err, ErrCodeUsedUp) || !errors.Is(b.res[2].Err, ErrCodeInvalid) {
		t.Fatalf("refused %v: %v, %v; want the second used up, the third invalid", refused, b.res[1].Err, b.res[2].Err)
	}
	codes = map[codeName]codeRow{{unitSKU, "h1"}: {maxUses: 9, buyer: keys.MustID("bob")}}
	b = batchOf(purchase(code("k1", "ann")))
	if decideAll(b, rows, nil, codes); !errors.Is(b.res[0].Err, ErrCodeInvalid) {
		t.Fatalf("another buyer's code: %v, want invalid", b.res[0].Err)
	}
}

func TestWithinABatch(t *testing.T) {
	seat := func(key, buyer string, seats ...string) Order {
		o := unitOrder(key, buyer, unitSKU, int64(len(seats)))
		for _, s := range seats {
			o.SeatIDs = append(o.SeatIDs, keys.MustID(s))
		}
		return o
	}
	again := purchase(unitOrder("k1", "ann", unitSKU, 1))
	b := batchOf(purchase(unitOrder("k1", "ann", unitSKU, 1)), again,
		purchase(seat("k3", "bob", "a1", "a2")), purchase(seat("k4", "cat", "a2", "a3")), purchase(seat("k5", "dan", "a3")))
	lines, kept, dups := b.within([]int{0, 1, 2, 3, 4})
	if want := []int{0, 2, 4}; !equalInts(kept, want) {
		t.Fatalf("kept %v, want %v", kept, want)
	}
	if !equalInts(dups, []int{1}) {
		t.Fatalf("dups %v, want the second copy of the request", dups)
	}
	var st *SeatsTakenError
	if !errors.As(b.res[3].Err, &st) || len(st.Seats) != 1 || st.Seats[0] != "a2" {
		t.Fatalf("take 3: %v, want seat a2 taken by the earlier take", b.res[3].Err)
	}
	if len(lines) != 3 {
		t.Fatalf("%d lines, want the three kept takes'", len(lines))
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
