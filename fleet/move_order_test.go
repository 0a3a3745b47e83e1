package fleet_test

// Found by TestModelConcurrent (e2e/model/concurrent_test.go): after a
// move, a program's feed told refunds and resales of orders it had not
// made yet.

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
)

// A move keeps the program's events in the order they were written: the
// target numbers them again (its own outbox sequence), in the source's
// seq order, whatever order the source's rows lie in on disk (a row
// written again, rows written by concurrent transactions, space freed by
// a program moved out and reused). Read by seq after the move, an order's
// order.created comes before its refund, as a feed reader or a relay
// consumer relies on.
func TestMoveKeepsTheEventsInOrder(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, 200*time.Millisecond)
	s := sku("ordered")
	place(t, f, s, "p1", 40)
	var orders []ledger.Order
	for i := range 6 {
		orders = append(orders, buy(t, f, s, fmt.Sprintf("k%d", i), "ann", 1))
	}
	for i, o := range orders[:3] {
		if _, _, err := f.Refund(ctx, o.ID, o.Buyer, refundReq(o.Buyer, fmt.Sprintf("r%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.EndSale(ctx, s); err != nil {
		t.Fatal(err)
	}
	read := func() []keys.ID {
		t.Helper()
		var ids []keys.ID
		for after := int64(0); ; {
			page, err := f.Events(ctx, s.Program, after, 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				return ids
			}
			for _, e := range page {
				ids = append(ids, e.ID)
			}
			after = page[len(page)-1].Seq
		}
	}
	before := read()
	// The program's oldest events written again on the source: their rows
	// now lie after the others on disk, as rows of concurrent writers or
	// rows in reused space may.
	db, err := sql.Open("pgx", urls[1])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `UPDATE events SET quantity = quantity WHERE program = $1 AND seq IN
		(SELECT seq FROM events WHERE program = $1 ORDER BY seq LIMIT 3)`, s.Program); err != nil {
		t.Fatal(err)
	}
	// Statistics as autovacuum keeps them: the program is most of the
	// table's rows, so its rows are read by a scan of the table, in the
	// order they lie on disk.
	if _, err := db.ExecContext(ctx, `ANALYZE events`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Move(ctx, s.Program, "main"); err != nil {
		t.Fatal(err)
	}
	if after := read(); !slices.Equal(after, before) {
		t.Errorf("the program's events by seq after the move:\n %v\nbefore it:\n %v", after, before)
	}
}

// A feed reader's cursor outlives a move (helper-58): it was read on the
// source, whose seqs may be far above the target's. The target numbers
// the program's events above the source's last seq, so every event
// written after the move is read on from that cursor (and the copied ones
// again, under the ids the reader de-duplicates by). Before, the target
// wrote them below the cursor, where the reader never looked.
func TestMoveKeepsAFeedReadersCursor(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, 200*time.Millisecond)
	db, err := sql.Open("pgx", urls[1])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The source has numbered a million events (its other programs').
	if _, err := db.ExecContext(ctx, `SELECT setval(pg_get_serial_sequence('events', 'seq'), 1000000)`); err != nil {
		t.Fatal(err)
	}
	s := sku("cursor")
	place(t, f, s, "p1", 10)
	a, b := buy(t, f, s, "k1", "ann", 1), buy(t, f, s, "k2", "bob", 1)
	if _, err := f.EndSale(ctx, s); err != nil {
		t.Fatal(err)
	}
	// The reader, up to date before the move.
	cursor := int64(0)
	seen := map[keys.ID]bool{}
	readOn := func() []ledger.Event {
		t.Helper()
		var got []ledger.Event
		for {
			page, err := f.Events(ctx, s.Program, cursor, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				return got
			}
			for _, e := range page {
				if !seen[e.ID] {
					seen[e.ID] = true
					got = append(got, e)
				}
			}
			cursor = page[len(page)-1].Seq
		}
	}
	if got := readOn(); len(got) == 0 || cursor <= 1000000 {
		t.Fatalf("before the move: %d events up to seq %d", len(got), cursor)
	}
	if _, err := f.Move(ctx, s.Program, "main"); err != nil {
		t.Fatal(err)
	}
	for i, o := range []ledger.Order{a, b} {
		if _, _, err := f.Refund(ctx, o.ID, o.Buyer, refundReq(o.Buyer, fmt.Sprintf("r%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	refunds := 0
	for _, e := range readOn() {
		if e.Type == "order.refunded" {
			refunds++
		}
	}
	if refunds != 2 {
		t.Fatalf("read on from seq %d after the move: %d order.refunded, want the 2 written there", cursor, refunds)
	}
}
