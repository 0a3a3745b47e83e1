package fleet_test

// Regression tests for breaks found reviewing the fleet (a ledger split
// over several PostgreSQL primaries). Each fails on the code it was
// written against; the comment above each says the scenario.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/relay"
	"github.com/stockgate/stockgate/stock"
)

// proxied puts a cuttable proxy in front of a database URL.
func proxied(t *testing.T, raw string) (string, *testenv.Proxy) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p, err := testenv.StartProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	u.Host = p.Addr
	return u.String(), p
}

func place(t *testing.T, f *fleet.Fleet, s stock.SKU, on string, total int64) {
	t.Helper()
	ctx := context.Background()
	if err := f.Place(ctx, s.Program, on); err != nil {
		t.Fatal(err)
	}
	if _, err := f.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: total, Shards: 1, MaxPerOrder: 10}); err != nil {
		t.Fatal(err)
	}
}

// closedWithOrder places s's program on the primary on, sells ann q of
// s under key, and ends the sale: a program ready to move.
func closedWithOrder(t *testing.T, f *fleet.Fleet, s stock.SKU, on, key string, q int64) ledger.Order {
	t.Helper()
	place(t, f, s, on, 10)
	o := buy(t, f, s, key, "ann", q)
	if _, err := f.EndSale(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return o
}

func hold(t *testing.T, f *fleet.Fleet, s stock.SKU, key, buyer string, q int64) ledger.Hold {
	t.Helper()
	r := f.Commit(context.Background(), []ledger.Take{ledger.HoldTake(ledger.Hold{IdempotencyKey: keys.MustID(key), SKU: s,
		Buyer: keys.MustID(buyer), Quantity: q, ExpiresAt: time.Now().Add(time.Hour), Gate: `[{"shards":1}]`})}, false)[0]
	if r.Err != nil {
		t.Fatalf("hold %s: %v", key, r.Err)
	}
	return r.Hold()
}

func refundReq(buyer keys.ID, key string) ledger.Request {
	return ledger.Request{Scope: buyer, Key: keys.MustID(key), Fingerprint: "refund " + key, Op: ledger.OpRefund}
}

// Found by an attack: one feed of every program over two primaries,
// numbered seq × N + index, skipped events (a quieter primary's later
// events fell below a caught-up reader's cursor) and stalled at limit=1.
// No single order spans primaries, so that feed is refused there; each
// program's own feed is whole, including what is written after a reader
// caught up.
func TestAttackEventsFeedPerProgram(t *testing.T) {
	ctx := context.Background()
	f := open(t, testenv.PostgresURLs(t, 2), time.Minute)
	busy, quiet := sku("busy"), sku("quiet")
	place(t, f, busy, "main", 100)
	place(t, f, quiet, "p1", 100)
	for i := range 6 {
		buy(t, f, busy, fmt.Sprintf("b%d", i), "ann", 1)
	}
	buy(t, f, quiet, "q0", "ann", 1)
	if _, err := f.Events(ctx, keys.ID{}, 0, 100); !errors.Is(err, fleet.ErrFeedPerProgram) || !errors.Is(err, stock.ErrInvalid) {
		t.Errorf("the feed of every program on two primaries: %v, want ErrFeedPerProgram (invalid)", err)
	}
	evs, err := f.Events(ctx, quiet.Program, 0, 100)
	if err != nil || len(evs) == 0 {
		t.Fatalf("quiet's feed: %d events, %v", len(evs), err)
	}
	last := evs[len(evs)-1].Seq
	o := buy(t, f, quiet, "q1", "bob", 1)
	var found bool
	for after := last; ; {
		page, err := f.Events(ctx, quiet.Program, after, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		found = found || page[0].Subject == o.ID
		after = page[0].Seq
	}
	if !found {
		t.Errorf("order %s, written after the reader caught up at %d, is not in its program's feed", o.ID, last)
	}
}

// fakeDead is one primary's dead letters (relay.Ledger, only what the
// admin calls use).
type fakeDead struct {
	relay.Ledger
	name   string
	seqs   []int64
	forgot []int64
}

func (d *fakeDead) letter(s int64) ledger.DeadLetter {
	return ledger.DeadLetter{Sink: "s", Event: ledger.Event{Seq: s, ID: keys.MustID(fmt.Sprintf("%s-%d", d.name, s)), Type: ledger.EventOrderCreated}}
}

func (d *fakeDead) DeadLetters(_ context.Context, _ string, after int64, limit int) ([]ledger.DeadLetter, error) {
	var out []ledger.DeadLetter
	for _, s := range d.seqs {
		if s > after && len(out) < limit {
			out = append(out, d.letter(s))
		}
	}
	return out, nil
}

func (d *fakeDead) DeadLetter(_ context.Context, _ string, seq int64) (ledger.DeadLetter, error) {
	if slices.Contains(d.seqs, seq) && !slices.Contains(d.forgot, seq) {
		return d.letter(seq), nil
	}
	return ledger.DeadLetter{}, ledger.ErrNotFound
}

func (d *fakeDead) ForgetDeadLetter(_ context.Context, _ string, seq int64) error {
	d.forgot = append(d.forgot, seq)
	return nil
}

type recSink struct{ got *[]string }

func (s recSink) Name() string { return "s" }
func (s recSink) Deliver(_ context.Context, e ledger.Event) error {
	*s.got = append(*s.got, e.ID.String())
	return nil
}

func group(t *testing.T, sink relay.Sink, ls ...*fakeDead) relay.Group {
	t.Helper()
	var g relay.Group
	for _, l := range ls {
		r, err := relay.New(l, relay.Options{Sinks: []relay.Sink{sink}})
		if err != nil {
			t.Fatal(err)
		}
		g = append(g, r)
	}
	return g
}

// BREAK: relay.Group.DeadLetters pages skip dead letters. Each primary
// is asked for limit rows from the cursor's own seq; the one at the
// cursor is dropped, so a primary gives limit-1 usable rows while the
// merge still fills the page from the other: main's dead seq 8 (Seq 16)
// is never listed (pages: [10 12] [14 201] []).
func TestAttackDeadLetterPagesSkip(t *testing.T) {
	var got []string
	g := group(t, recSink{&got}, &fakeDead{name: "main", seqs: []int64{5, 6, 7, 8}}, &fakeDead{name: "p1", seqs: []int64{100}})
	var listed []int64
	after := int64(0)
	for range 100 {
		page, err := g.DeadLetters(context.Background(), "s", after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, d := range page {
			listed = append(listed, d.Event.Seq)
		}
		after = page[len(page)-1].Event.Seq
	}
	const k = relay.DeadStride
	if want := []int64{5 * k, 6 * k, 7 * k, 8 * k, 100*k + 1}; !slices.Equal(listed, want) {
		t.Errorf("dead letters listed page by page: %v, want %v", listed, want)
	}
}

// BREAK: a dead letter's Seq depends on how many primaries the replica
// has. While a primary is being added (a rolling deploy: some replicas
// with two, some with three), a Seq one replica listed names another
// dead letter on the next: redelivering p1's seq 4 (Seq 9 with two
// primaries) through a replica with three redelivers main's seq 3.
func TestAttackDeadLetterSeqAcrossRollout(t *testing.T) {
	var got []string
	main, p1, p2 := &fakeDead{name: "main", seqs: []int64{3}}, &fakeDead{name: "p1", seqs: []int64{4}}, &fakeDead{name: "p2"}
	sink := recSink{&got}
	old, upd := group(t, sink, main, p1), group(t, sink, main, p1, p2)
	page, err := old.DeadLetters(context.Background(), "s", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var seq int64 = -1
	for _, d := range page {
		if d.Event.ID == "p1-4" {
			seq = d.Event.Seq
		}
	}
	if seq < 0 {
		t.Fatalf("p1's dead letter not listed: %+v", page)
	}
	d, err := upd.Redeliver(context.Background(), "s", seq)
	if err == nil && d.Event.ID != "p1-4" {
		t.Errorf("redelivered %s (delivered %v, main forgot %v) for the Seq %d that named p1-4", d.Event.ID, got, main.forgot, seq)
	}
}

// BREAK: adding a primary to a ledger that already has programs (the
// documented way: add -ledger-primaries and roll out). Nothing fills the
// directory with the programs already on main, so the first write that
// may place a program (PutSKU, SetProgram, PutQueue) places an old one on
// the least-loaded primary: a restock of a sold-out program creates a
// fresh SKU row on p1 (sold 0) and every later read and sale of it goes
// there, while its 10 sold tickets stay on main: the same seats sell
// again. Such a program also cannot be moved ("on no primary").
func TestAttackExistingProgramSplitWhenPrimaryAdded(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	old := sku("legacy")
	one := open(t, urls[:1], time.Minute) // before the primary was added
	if _, err := one.PutSKU(ctx, ledger.SKUConfig{SKU: old, Total: 10, Shards: 1, MaxPerOrder: 10}); err != nil {
		t.Fatal(err)
	}
	buy(t, one, old, "l1", "ann", 10)

	f := open(t, urls, time.Minute) // p1 added
	if _, err := f.PutSKU(ctx, ledger.SKUConfig{SKU: sku("newer"), Total: 5, Shards: 1, MaxPerOrder: 4}); err != nil {
		t.Fatal(err)
	}
	if st, err := f.SKU(ctx, old); err != nil || st.Sold != 10 {
		t.Fatalf("the old program before its restock: %+v %v", st, err)
	}
	if _, err := f.PutSKU(ctx, ledger.SKUConfig{SKU: old, Total: 12, Shards: 1, MaxPerOrder: 10}); err != nil {
		t.Fatal(err)
	}
	st, err := f.SKU(ctx, old)
	pl, _ := f.First().PlacementOf(ctx, old.Program)
	if err != nil || st.Sold != 10 || st.Total != 12 {
		t.Errorf("after restocking to 12 a program with 10 sold: sold %d of %d (%v), placed on %q; want sold 10 of 12", st.Sold, st.Total, err,
			pl.Primary)
	}
	r := f.Commit(ctx, []ledger.Take{ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID("l2"), SKU: old, Buyer: keys.MustID("bob"),
		Quantity: 5, Gate: `[{"shards":1}]`, Req: ledger.Request{Scope: keys.MustID("bob"), Key: keys.MustID("l2"), Fingerprint: "buy l2",
			Op: ledger.OpPurchase}})}, false)
	if r[0].Err == nil {
		t.Errorf("sold 5 more of a program with 10 of 12 sold (oversold by 3)")
	}
}

// BREAK: a move stopped while marked moving (its process killed during
// the wait), then "finished" by running it towards where the program
// is: Move answers success but leaves it marked moving, and every write
// of the program is refused from then on.
func TestAttackMoveToItsOwnPrimaryLeavesItMoving(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, time.Millisecond)
	s := sku("stuck")
	place(t, f, s, "main", 10)
	if err := f.First().MarkMoving(ctx, s.Program, "main", "killed", fleet.MoveLease); err != nil { // the killed move's step 1
		t.Fatal(err)
	}
	ageMark(t, urls[0], s.Program) // its lease lapsed
	if _, err := f.Move(ctx, s.Program, "main"); err != nil {
		t.Fatalf("move to where it is: %v", err)
	}
	if _, err := f.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 12, Shards: 1, MaxPerOrder: 10}); err != nil {
		pl, _ := f.First().PlacementOf(ctx, s.Program)
		t.Errorf("the move answered success, but a write after it is refused: %v (placement %+v)", err, pl)
	}
}

// BREAK: two runs of one move at once (the command run again while the
// first still runs: "run the same command again after any failure")
// lose the program. Run 2 sees it moving and drops the target's copy;
// run 1 then points the directory at the target and deletes the
// source's rows: no primary has the program's SKUs or orders any more.
func TestAttackConcurrentMoveRunsLoseTheProgram(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, time.Millisecond)
	s := sku("twice")
	place(t, f, s, "main", 10)
	o := buy(t, f, s, "t1", "ann", 3)
	dir := f.First()
	m := copiedMove(t, f, s, "run1") // run 1, by the steps Move takes, as far as the copy
	// Run 2: refused while run 1 holds the mark.
	second := open(t, urls, time.Millisecond)
	if _, err := second.Move(ctx, s.Program, "p1"); !errors.Is(err, ledger.ErrMoveRunning) {
		t.Errorf("a second run during the first: %v, want ErrMoveRunning", err)
	}
	// Run 1 goes on: the directory, then the source's rows.
	if err := dir.EndMoving(ctx, s.Program, "run1", "p1"); err != nil {
		t.Fatal(err)
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	fresh := open(t, urls, time.Minute)
	if got, err := fresh.OrderByID(ctx, o.ID); err != nil || got.Quantity != 3 {
		st, serr := fresh.SKU(ctx, s)
		t.Errorf("a confirmed order after two runs of one move: %+v %v; the SKU: %+v %v", got, err, st, serr)
	}
}

// BREAK: a move whose last step (deleting the source's rows) failed
// leaves the directory on the target and a full copy on the source
// ("run the move again to delete them"). Until then calls by id go where
// the row's lane was seen, the source, and write the stale copy: a
// refund answers success but the order on the target, the one every
// reader sees and the rerun keeps, is not refunded (the rerun deletes the
// refund with the copy).
//
// The replica here reads the directory at every call (PlaceTTL 1ms): a
// real move waits out every replica's PlaceTTL after marking the program
// moving, so none acts on a place read before the mark; what is checked
// is that a call by id follows the directory, not the row's lane or a
// copy.
func TestAttackStaleCopyWrittenAfterFailedFinish(t *testing.T) {
	ctx := context.Background()
	f := open(t, testenv.PostgresURLs(t, 2), time.Millisecond)
	s := sku("stale")
	place(t, f, s, "main", 10)
	o := buy(t, f, s, "s1", "ann", 2)
	p1, dir := f.Primary("p1"), f.First()
	m := copiedMove(t, f, s, "run")
	if err := dir.EndMoving(ctx, s.Program, "run", "p1"); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel() // the source's connection drops as the rows are deleted
	if err := m.Finish(gone); err == nil {
		t.Fatal("finish with a dead connection succeeded")
	}
	if _, _, err := f.Refund(ctx, o.ID, o.Buyer, refundReq(o.Buyer, "r1")); err != nil {
		t.Fatalf("refund: %v", err)
	}
	if got, err := p1.OrderByID(ctx, o.ID); err != nil || got.RefundedAt.IsZero() {
		st, _ := f.SKU(ctx, s)
		t.Errorf("the refund answered success, but the order on p1 (the directory's) is not refunded: %+v %v; SKU sold %d", got, err, st.Sold)
	}
}

// BREAK: after a program moved off main, a call by id for its rows
// still asks main first (the lane was seen there) and answers main's
// error: with main down, refunds of a program living on p1, which is up,
// fail ("one primary down stops only its own programs").
func TestAttackMovedRowsUnreachableWhileOldPrimaryDown(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	mainURL, proxy := proxied(t, urls[0])
	f := open(t, []string{mainURL, urls[1]}, time.Millisecond)
	s := sku("moved")
	o := closedWithOrder(t, f, s, "main", "m1", 2)
	if _, err := f.Move(ctx, s.Program, "p1"); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	defer proxy.Restore()
	if _, err := f.OrderByID(ctx, o.ID); err != nil {
		t.Errorf("read of an order on p1 with main down: %v", err)
	}
	if _, _, err := f.Refund(ctx, o.ID, o.Buyer, refundReq(o.Buyer, "r1")); err != nil {
		t.Errorf("refund of an order on p1 with main down: %v", err)
	}
}

// BREAK: a batch of confirms over two primaries, one of them down:
// main's share commits, p1's fails before writing, and ConfirmBatch
// answers the whole batch with p1's ErrNotCommitted ("nothing written")
// although main's confirm committed. The sale layer then decides each
// alone and gets a replay (ErrDuplicate): the fresh confirm's follow-up
// (seats sold in Redis, the hold budget freed) is skipped.
func TestAttackBatchErrorHidesCommittedShare(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	p1URL, proxy := proxied(t, urls[1])
	f := open(t, []string{urls[0], p1URL}, time.Minute)
	a, b := sku("share-a"), sku("share-b")
	place(t, f, a, "main", 10)
	place(t, f, b, "p1", 10)
	ha, hb := hold(t, f, a, "ha", "ann", 1), hold(t, f, b, "hb", "ann", 1)
	proxy.Cut()
	defer proxy.Restore()
	cs := []ledger.HoldRequest{
		{HoldID: ha.ID, Buyer: ha.Buyer, Req: ledger.Request{Scope: ha.Buyer, Key: keys.MustID("ca"), Fingerprint: "confirm", Op: ledger.OpConfirm}},
		{HoldID: hb.ID, Buyer: hb.Buyer, Req: ledger.Request{Scope: hb.Buyer, Key: keys.MustID("cb"), Fingerprint: "confirm", Op: ledger.OpConfirm}},
	}
	_, err := f.ConfirmBatch(ctx, cs)
	if err == nil {
		return
	}
	if got, herr := f.Primary("main").HoldByID(ctx, ha.ID); herr == nil && got.State == ledger.Confirmed {
		t.Errorf("ConfirmBatch failed as a whole (%v; ErrNotCommitted: %v) while main's confirm committed",
			err, errors.Is(err, ledger.ErrNotCommitted))
	}
}

// BREAK: a replica that cannot read the directory (main unreachable from
// it, the others reachable) routes on what it read before, for as long
// as that lasts; Move waits only PlaceTTL for replicas to see "moving".
// Moved from p1 to main meanwhile, the program is written on p1 again by
// that replica: a restock makes a fresh SKU there and it sells tickets
// nobody reading the directory will ever see.
func TestAttackPartitionedReplicaWritesAfterMove(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	mainURL, proxy := proxied(t, urls[0])
	mover := open(t, urls, time.Millisecond)
	r := open(t, []string{mainURL, urls[1]}, time.Millisecond)
	s := sku("partition")
	closedWithOrder(t, mover, s, "p1", "p-1", 4)
	if _, err := r.SKU(ctx, s); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	defer proxy.Restore()
	if _, err := mover.Move(ctx, s.Program, "main"); err != nil {
		t.Fatal(err)
	}
	_, perr := r.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 10, Shards: 1, MaxPerOrder: 10})
	res := r.Commit(ctx, []ledger.Take{ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID("p-2"), SKU: s, Buyer: keys.MustID("bob"),
		Quantity: 3, Gate: `[{"shards":1}]`, Req: ledger.Request{Scope: keys.MustID("bob"), Key: keys.MustID("p-2"), Fingerprint: "buy p-2",
			Op: ledger.OpPurchase}})}, false)
	if res[0].Err == nil {
		st, _ := mover.SKU(ctx, s)
		t.Errorf("after the move to main, the cut-off replica restocked (%v) and sold 3 on p1; main's SKU: sold %d ended %v",
			perr, st.Sold, !st.EndedAt.IsZero())
	} else if perr == nil {
		has, _ := mover.Primary("p1").HasProgram(ctx, s.Program)
		t.Errorf("after the move to main, the cut-off replica's restock landed on p1 (p1 has the program again: %v)", has)
	}
}

// BREAK: Idempotency-Keys are unique per primary only (documented), but
// the move copies the requests table under its (scope, key) primary key:
// one buyer who used one key on a program on main and on another on p1
// makes the first unmovable to p1, for good.
func TestAttackReusedKeyBlocksMove(t *testing.T) {
	ctx := context.Background()
	f := open(t, testenv.PostgresURLs(t, 2), time.Millisecond)
	a, b := sku("reuse-a"), sku("reuse-b")
	place(t, f, a, "main", 10)
	place(t, f, b, "p1", 10)
	for i, s := range []stock.SKU{a, b} {
		r := f.Commit(ctx, []ledger.Take{ledger.PurchaseTake(ledger.Order{IdempotencyKey: keys.MustID(fmt.Sprintf("row%d", i)), SKU: s,
			Buyer: keys.MustID("ann"), Quantity: 1, Gate: `[{"shards":1}]`,
			Req: ledger.Request{Scope: keys.MustID("ann"), Key: keys.MustID("same"), Fingerprint: "buy " + s.String(), Op: ledger.OpPurchase}})}, false)
		if r[0].Err != nil {
			t.Fatalf("buy %s: %v", s, r[0].Err)
		}
	}
	if _, err := f.EndSale(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Move(ctx, a.Program, "p1"); err != nil {
		t.Errorf("move of a closed program: %v", err)
	}
}

// ageMark makes program's move mark older than the move lease, as a mark
// left by a move that stopped long ago.
func ageMark(t *testing.T, dirURL string, program keys.ID) {
	t.Helper()
	db, err := sql.Open("pgx", dirURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE program_primaries SET updated_at = updated_at - $2 WHERE program = $1`,
		program, (fleet.MoveLease + time.Minute).Milliseconds()); err != nil {
		t.Fatal(err)
	}
}

// copiedMove ends s's sale and takes a move of its program from main to
// p1 by Move's steps, under token, as far as the copy.
func copiedMove(t *testing.T, f *fleet.Fleet, s stock.SKU, token string) *ledger.Move {
	t.Helper()
	ctx := context.Background()
	if _, err := f.EndSale(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := f.First().MarkMoving(ctx, s.Program, "main", token, fleet.MoveLease); err != nil {
		t.Fatal(err)
	}
	m, err := ledger.BeginMove(ctx, f.Primary("main"), f.Primary("p1"), s.Program, "p1", token)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Copy(ctx); err != nil {
		t.Fatal(err)
	}
	return m
}
