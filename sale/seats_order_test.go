package sale

import (
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// bestAdjacent (the ledger-side choice while Redis is out) orders rows as
// seats_best.lua does: 2 before 10, Z before AA.
func TestBestAdjacentRowOrder(t *testing.T) {
	var all []ledger.Seat
	for _, r := range []string{"AA", "10", "Z", "2"} {
		for n := range 2 {
			all = append(all, ledger.Seat{ID: keys.MustID(r + "-" + strconv.Itoa(n+1)), Row: r, Number: n + 1, State: "free"})
		}
	}
	if got := bestAdjacent(all, 2); fmt.Sprint(got) != "[2-1 2-2]" {
		t.Errorf("bestAdjacent = %v, want row 2 first", got)
	}
	slices.SortFunc(all, func(a, b ledger.Seat) int { return rowCompare(a.Row, b.Row) })
	var rows []string
	for i := 0; i < len(all); i += 2 {
		rows = append(rows, all[i].Row)
	}
	if fmt.Sprint(rows) != "[2 Z 10 AA]" {
		t.Errorf("rows in order %v, want [2 Z 10 AA]", rows)
	}
}
