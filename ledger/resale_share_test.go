package ledger

import (
	"slices"
	"testing"
)

// resaleShares gives each sale only to the listings begun before it:
// the sales made before a second listing began went to it too
// (helper-102), so it sold tickets the public stock had sold.
func TestResaleSharesGiveSalesOnlyToListingsBeforeThem(t *testing.T) {
	for _, tc := range []struct {
		name        string
		mode        string
		sales       []resaleSale
		open        []openListing
		base, carry int64
		want        []int64
		wantCarry   int64
	}{
		{
			// helper-102's: sam's 1 listed (since 10), 5 public sales,
			// tom's 10 listed (since 15), nothing sold after.
			name: "first, sales before the second listing", mode: ResaleFirst,
			sales: []resaleSale{{11, 1}, {12, 1}, {13, 1}, {14, 1}, {15, 1}},
			open:  []openListing{{10, 1}, {15, 10}},
			want:  []int64{1, 0},
		},
		{
			name: "first, sales after both", mode: ResaleFirst,
			sales: []resaleSale{{12, 1}, {16, 3}},
			open:  []openListing{{10, 1}, {15, 10}},
			want:  []int64{1, 3},
		},
		{
			// Sam's listing sold out before tom's began: the later sales
			// are tom's.
			name: "first, the older sold out by the earlier group", mode: ResaleFirst,
			sales: []resaleSale{{11, 2}, {16, 2}},
			open:  []openListing{{10, 1}, {15, 10}},
			want:  []int64{1, 2},
		},
		{
			// A hold's confirm keyed at tom's since (held when it began):
			// sam's only.
			name: "first, a confirm of a hold held when the second began", mode: ResaleFirst,
			sales: []resaleSale{{15, 2}},
			open:  []openListing{{10, 1}, {15, 4}},
			want:  []int64{1, 0},
		},
		{
			name: "sales before every listing", mode: ResaleFirst,
			sales: []resaleSale{{3, 4}},
			open:  []openListing{{10, 1}},
			want:  []int64{0},
		},
		{
			// One group: as the settle before since (listed 5 of 20 for
			// sale, 3 sold: 0.75 carried).
			name: "alongside, one group", mode: ResaleAlongside,
			sales: []resaleSale{{21, 1}, {22, 1}, {23, 1}},
			open:  []openListing{{20, 1}, {20, 4}},
			base:  20 - 3,
			want:  []int64{0, 0}, wantCarry: 750_000,
		},
		{
			// 4 sales while sam's 2 of 10 were for sale: 0.8 of a unit;
			// then tom's 6 listed, 3 sales of the 12 for sale beside the 8
			// listed: 2, and the 0.8 carried. Counted as one group (the
			// rule before), the 7 sales of 16 beside 8 listed were 3.5.
			name: "alongside, two groups", mode: ResaleAlongside,
			sales: []resaleSale{{11, 1}, {12, 1}, {13, 1}, {14, 1}, {16, 1}, {17, 1}, {18, 1}},
			open:  []openListing{{10, 2}, {15, 6}},
			// Less the 7 sales and tom's 6 not on sale yet, 10 were.
			base: 10 - 7 + 6,
			want: []int64{2, 0}, wantCarry: 800_000,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, carry := resaleShares(tc.mode, tc.sales, tc.open, tc.base, tc.carry)
			if !slices.Equal(got, tc.want) || carry != tc.wantCarry {
				t.Errorf("got %v, carry %d; want %v, carry %d", got, carry, tc.want, tc.wantCarry)
			}
		})
	}
}
