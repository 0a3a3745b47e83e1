package fleet_test

// Regression tests for breaks a second review found in the fixes of the
// first (attack_test.go). Each fails on the code it was written against;
// the comment above each says the scenario.

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/internal/wait"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// BREAK: a move killed after BeginMove committed the source's tombstone
// (here: its source transaction dropped, as when the process dies during
// the copy) leaves the tombstone behind. Taken back by running the move
// towards where the program is (or by a rerun that gives up before its
// own BeginMove, e.g. Ctrl-C during the PlaceTTL wait), Move answers
// success and the directory says the program is writable on main, but the
// tombstone is never lifted: every restock (PutSKU), SetProgram and
// PutQueue of the program is refused with ErrMoving, for good.
func TestAttack2KilledMoveTombstoneBlocksForever(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, time.Millisecond)
	s := sku("killed")
	closedWithOrder(t, f, s, "main", "k1", 2)
	// The killed run: its mark, its tombstone and source transaction.
	if err := f.First().MarkMoving(ctx, s.Program, "main", "killed", fleet.MoveLease); err != nil {
		t.Fatal(err)
	}
	dying, die := context.WithCancel(ctx)
	if _, err := ledger.BeginMove(dying, f.Primary("main"), f.Primary("p1"), s.Program, "p1", "killed"); err != nil {
		t.Fatal(err)
	}
	die() // the process dies: its source transaction rolls back, the tombstone stays
	ageMark(t, urls[0], s.Program)
	if _, err := f.Move(ctx, s.Program, "main"); err != nil {
		t.Fatalf("taking the program back to where it is: %v", err)
	}
	pl, _ := f.First().PlacementOf(ctx, s.Program)
	if _, err := f.PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 20, Shards: 1, MaxPerOrder: 10}); err != nil {
		t.Errorf("the program is on %s and not moving (%+v), but its restock is refused: %v", pl.Primary, pl, err)
	}
}

// BREAK: a run whose mark lapsed (its copy took longer than MoveLease) is
// taken over by a second run; the second commits its tombstone and waits
// for the first's move lock. The first then fails (its copy, or EndMoving
// as the mark is no longer its own) and Abort lifts the tombstone by
// program: the second run's. The second run completes the move with no
// tombstone on the source, so a replica cut off from the directory
// creates the moved program's rows there again (the break
// TestAttackPartitionedReplicaWritesAfterMove was fixed for).
func TestAttack2TakenOverRunLiftsTheNewRunsTombstone(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, time.Millisecond)
	s := sku("takeover")
	closedWithOrder(t, f, s, "main", "t1", 2)
	// Run 1, by Move's steps, has locked and read the source.
	if err := f.First().MarkMoving(ctx, s.Program, "main", "run1", fleet.MoveLease); err != nil {
		t.Fatal(err)
	}
	m, err := ledger.BeginMove(ctx, f.Primary("main"), f.Primary("p1"), s.Program, "p1", "run1")
	if err != nil {
		t.Fatal(err)
	}
	ageMark(t, urls[0], s.Program) // run 1's copy outlasts the lease
	second := open(t, urls, time.Millisecond)
	done := make(chan error, 1)
	go func() { _, err := second.Move(ctx, s.Program, "p1"); done <- err }()
	// Wait until run 2 waits for run 1's move lock (its tombstone written).
	db, err := sql.Open("pgx", urls[0])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	wait.For(t, 20*time.Second, "run 2 waiting for run 1's lock", func() bool {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	// Run 1 fails (its copy; or EndMoving, the mark being run 2's) and
	// gives up.
	if err := f.First().EndMoving(ctx, s.Program, "run1", "p1"); !errors.Is(err, ledger.ErrMoveRunning) {
		t.Fatalf("run 1's EndMoving after the takeover: %v", err)
	}
	if err := m.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("run 2: %v", err)
	}
	if pl, err := f.First().PlacementOf(ctx, s.Program); err != nil || pl.Primary != "p1" {
		t.Fatalf("after run 2: %+v %v", pl, err)
	}
	// A replica cut off from the directory still writes to main.
	if _, err := f.Primary("main").PutSKU(ctx, ledger.SKUConfig{SKU: s, Total: 10, Shards: 1, MaxPerOrder: 10}); !errors.Is(err, ledger.ErrMoving) {
		t.Errorf("the program moved to p1, but a write creating it on main again: %v, want ErrMoving (no tombstone left on main)", err)
	}
}

// BREAK: batches are not routed by the directory when the row's lane is
// unknown (a fresh replica): every such request goes to the first
// primary. After a move main -> p1 whose last step failed (the source's
// rows left behind: "run the move again to delete them"), a fresh
// replica's RefundBatch refunds the stale copy on main and answers
// success; the order on p1, the one every reader sees and the rerun
// keeps, is not refunded (the fix of TestAttackStaleCopyWrittenAfterFailedFinish
// covers byID, not batchByID).
func TestAttack2BatchRefundsStaleCopy(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, time.Millisecond)
	s := sku("batchstale")
	place(t, f, s, "main", 10)
	o := buy(t, f, s, "b1", "ann", 2)
	m := copiedMove(t, f, s, "run")
	if err := f.First().EndMoving(ctx, s.Program, "run", "p1"); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := m.Finish(gone); err == nil {
		t.Fatal("finish with a dead connection succeeded")
	}
	fresh := open(t, urls, time.Millisecond)
	got, err := fresh.RefundBatch(ctx, []ledger.OrderRequest{{OrderID: o.ID, Buyer: o.Buyer, Req: refundReq(o.Buyer, "rb1")}})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Err != nil {
		return // decided alone: byID follows the directory
	}
	if p1o, err := f.Primary("p1").OrderByID(ctx, o.ID); err != nil || p1o.RefundedAt.IsZero() {
		st, _ := f.SKU(ctx, s)
		t.Errorf("RefundBatch answered success, but the order on p1 (the directory's) is not refunded: %+v %v; SKU sold %d", p1o, err, st.Sold)
	}
}

// BREAK: a replica that never read a program's place and cannot read the
// directory falls back to "the primary that holds the program's rows",
// asking every primary but the first, and ignoring tombstones. After a
// move p1 -> main whose last step failed (p1 keeps a stale copy and the
// tombstone), with main unreachable from the replica, a refund of the
// program's order is written on p1's stale copy and answered success: the
// program lives on main (down: the right answer is 503), and the rerun of
// the move deletes the refund with the copy.
func TestAttack2DirectoryDownFallbackWritesStaleCopy(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	mainURL, proxy := proxied(t, urls[0])
	mover := open(t, urls, time.Millisecond)
	r := open(t, []string{mainURL, urls[1]}, time.Millisecond) // before the program exists
	s := sku("fallback")
	o := closedWithOrder(t, mover, s, "p1", "f1", 2)
	dir := mover.First()
	if err := dir.MarkMoving(ctx, s.Program, "p1", "run", fleet.MoveLease); err != nil {
		t.Fatal(err)
	}
	m, err := ledger.BeginMove(ctx, mover.Primary("p1"), mover.Primary("main"), s.Program, "main", "run")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Copy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := dir.EndMoving(ctx, s.Program, "run", "main"); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := m.Finish(gone); err == nil {
		t.Fatal("finish with a dead connection succeeded")
	}
	proxy.Cut()
	defer proxy.Restore()
	_, _, err = r.Refund(ctx, o.ID, o.Buyer, refundReq(o.Buyer, "rf1"))
	if err == nil {
		mo, merr := mover.Primary("main").OrderByID(ctx, o.ID)
		t.Errorf("with main (the program's primary and the directory) down, a refund answered success on p1's stale copy; "+
			"main's order refunded: %v (%v)", !mo.RefundedAt.IsZero(), merr)
	}
}

// BREAK (helper-37): access codes put on the source while a move copies
// the program: PutCodes had no fence, answered 200, and Finish deleted
// the codes the copy never read. Now refused (ErrMoving) under the
// source's tombstone, as PutSKU is.
func TestAttack2CodesFencedDuringAMove(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, time.Millisecond)
	s := sku("codesmove")
	place(t, f, s, "main", 10)
	pool := s.InPool(keys.MustID("club"))
	if _, err := f.PutPool(ctx, ledger.PoolConfig{SKU: pool, Allotment: 2, Shards: 1, Rule: ledger.PoolRule{Access: ledger.AccessCode}, Create: true}); err != nil {
		t.Fatal(err)
	}
	for _, x := range []stock.SKU{s, pool} {
		if _, err := f.EndSale(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	// The codes are put on the source while the move holds it (a replica
	// that still routes the program there): they wait for the move's
	// lock, or, unfenced, commit at once where Finish will delete them.
	err := duringAMove(t, f, urls[0], s.Program, func() error {
		_, err := f.Primary("main").PutCodes(ctx, pool, []ledger.Code{{Hash: "h-during-move", MaxUses: 1}})
		return err
	})
	if !errors.Is(err, ledger.ErrMoving) {
		t.Errorf("codes put on the source during the move: %v, want ErrMoving (Finish deleted what it put)", err)
	}
}

// BREAK (helper-37): a move that stopped between its copy and the switch
// (the mover died: its source transaction gone, its tombstone on the
// source, its full copy on the target) left a copy with no mark. A
// replica that cannot read the directory asks the other primaries where
// the program lives: the source said no (its tombstone), the copy said
// yes, and a refund was committed on the copy, answered 200, and deleted
// with the copy by the move's rerun. The copy is marked arriving now:
// that replica finds no home (503) until a completed move lifts the mark,
// and then finds the program on its new primary.
func TestAttack3StoppedMoveCopyIsNobodysHome(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 3)
	mainURL, proxy := proxied(t, urls[0])
	mover := open(t, urls, time.Millisecond)
	r := open(t, []string{mainURL, urls[1], urls[2]}, time.Millisecond) // before the program exists
	s := sku("arriving")
	o := closedWithOrder(t, mover, s, "p1", "a1", 2)
	if err := mover.First().MarkMoving(ctx, s.Program, "p1", "died", fleet.MoveLease); err != nil {
		t.Fatal(err)
	}
	m, err := ledger.BeginMove(ctx, mover.Primary("p1"), mover.Primary("p2"), s.Program, "p2", "died")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Copy(ctx); err != nil {
		t.Fatal(err)
	}
	m.Release() // the mover dies before the switch

	proxy.Cut()
	if _, _, err := r.Refund(ctx, o.ID, o.Buyer, refundReq(o.Buyer, "ra1")); err == nil {
		c, cerr := mover.Primary("p2").OrderByID(ctx, o.ID)
		t.Fatalf("with the directory down, a refund answered success; refunded on p2's unswitched copy: %v (%v)",
			!c.RefundedAt.IsZero(), cerr)
	}
	proxy.Restore()

	ageMark(t, urls[0], s.Program)
	if _, err := mover.Move(ctx, s.Program, "p2"); err != nil {
		t.Fatalf("the move run again: %v", err)
	}
	proxy.Cut()
	defer proxy.Restore()
	got, ok, err := r.Refund(ctx, o.ID, o.Buyer, refundReq(o.Buyer, "ra2"))
	if err != nil || !ok {
		t.Fatalf("after the move, with the directory down, the refund: %v %v (the arrival mark still stands?)", ok, err)
	}
	if c, err := mover.Primary("p2").OrderByID(ctx, got.ID); err != nil || c.RefundedAt.IsZero() {
		t.Errorf("refund answered on the moved program, but p2's order is %+v (%v)", c, err)
	}
}

// BREAK (helper-40): a replica that read a program's place before it
// moved away (p1 -> p2), and cannot read the directory now, routed by
// what it read: to p1, where a move back that stopped after its copy left
// the program's rows, marked arriving. Its refund was committed on that
// copy and answered success; the move's rerun deletes the copy. What was
// read now stands only if its primary still has the program at home.
func TestAttack3StaleCacheFindsNoHomeOnAMarkedCopy(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 3)
	mainURL, proxy := proxied(t, urls[0])
	mover := open(t, urls, time.Millisecond)
	r := open(t, []string{mainURL, urls[1], urls[2]}, time.Millisecond)
	s := sku("staleback")
	o := closedWithOrder(t, mover, s, "p1", "s1", 2)
	if _, err := r.OrderByID(ctx, o.ID); err != nil { // r reads the program's place: p1
		t.Fatal(err)
	}
	if _, err := mover.Move(ctx, s.Program, "p2"); err != nil {
		t.Fatal(err)
	}
	// The move back stops after its copy.
	if err := mover.First().MarkMoving(ctx, s.Program, "p2", "back", fleet.MoveLease); err != nil {
		t.Fatal(err)
	}
	m, err := ledger.BeginMove(ctx, mover.Primary("p2"), mover.Primary("p1"), s.Program, "p1", "back")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Copy(ctx); err != nil {
		t.Fatal(err)
	}
	m.Release()

	proxy.Cut()
	defer proxy.Restore()
	if _, _, err := r.Refund(ctx, o.ID, o.Buyer, refundReq(o.Buyer, "rs1")); err == nil {
		c, cerr := mover.Primary("p1").OrderByID(ctx, o.ID)
		t.Errorf("with the directory down, a refund answered success; refunded on p1's unswitched copy: %v (%v)",
			!c.RefundedAt.IsZero(), cerr)
	}
}

// BREAK (helper-48): a replica that read a program as moving kept
// routing its reads to the source for the rest of PlaceTTL after the
// move flipped the directory and deleted the source's rows: every read by
// id answered "not found" (404 for an order, a hold, a committed
// purchase's retry) while the target had them.
func TestReadsFollowAMoveAtOnce(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	mover := open(t, urls, time.Second)
	s := sku("follow")
	o := closedWithOrder(t, mover, s, "main", "f-1", 2)
	moved := make(chan error, 1)
	go func() {
		_, err := mover.Move(ctx, s.Program, "p1")
		moved <- err
	}()
	// A replica that reads the program only once it is moving: its
	// PlaceTTL is long, so what it read stands unless read again.
	wait.For(t, time.Minute, "the program marked moving", func() bool {
		pl, err := mover.First().PlacementOf(ctx, s.Program)
		return err == nil && pl.Moving
	})
	r := open(t, urls, time.Hour)
	if _, err := r.OrderByID(ctx, o.ID); err != nil {
		t.Fatalf("order on the source while it moves: %v", err)
	}
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	if has, _ := mover.Primary("main").HasProgram(ctx, s.Program); has {
		t.Fatal("the source still has the program's rows: the read below proves nothing")
	}
	if _, err := r.OrderByID(ctx, o.ID); err != nil {
		t.Errorf("order after the move, on a replica that read the program as moving: %v", err)
	}
	if rec, err := r.RequestByKey(ctx, s.Program, o.Buyer, keys.MustID("f-1")); err != nil || rec.Order == nil || rec.Order.ID != o.ID {
		t.Errorf("the order's request after the move: %+v %v", rec, err)
	}
}

// A pool closed on the source while a move copies its program (a sweeper
// reaches every primary, helper-72 #2): ClosePool had no fence and
// committed at once, a pool.moved event on a copy Finish deletes (or, a
// move stopped after the switch, a second one beside the new home's). It
// waits for the move's lock now, and the source's tombstone refuses it.
func TestPoolCloseFencedDuringAMove(t *testing.T) {
	ctx := context.Background()
	urls := testenv.PostgresURLs(t, 2)
	f := open(t, urls, time.Millisecond)
	s := sku("closemove")
	place(t, f, s, "main", 10)
	pool := s.InPool(keys.MustID("club"))
	if _, err := f.PutPool(ctx, ledger.PoolConfig{SKU: pool, Allotment: 2, Shards: 1, Create: true}); err != nil {
		t.Fatal(err)
	}
	for _, x := range []stock.SKU{s, pool} { // a move takes a program whose sale is over
		if _, err := f.EndSale(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	err := duringAMove(t, f, urls[0], s.Program, func() error {
		_, _, err := f.Primary("main").ClosePool(ctx, pool, true)
		return err
	})
	if !errors.Is(err, ledger.ErrMoving) {
		t.Errorf("pool closed on the source during the move: %v, want ErrMoving", err)
	}
	if st, err := f.SKU(ctx, pool); err != nil || !st.Rule.ClosedAt.IsZero() || st.Remaining() != 2 {
		t.Errorf("the pool on its new home: %+v, %v; want it open with its 2 units", st, err)
	}
}

// duringAMove moves program from main to p1 (source at sourceURL) and runs
// write on the source once the move holds the program's lock, waiting for
// it there before the copy goes on (else write could come after Finish,
// which is not the race). It returns write's error.
func duringAMove(t *testing.T, f *fleet.Fleet, sourceURL string, program keys.ID, write func() error) error {
	t.Helper()
	ctx := context.Background()
	if err := f.First().MarkMoving(ctx, program, "main", "run", fleet.MoveLease); err != nil {
		t.Fatal(err)
	}
	m, err := ledger.BeginMove(ctx, f.Primary("main"), f.Primary("p1"), program, "p1", "run")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- write() }()
	db, err := sql.Open("pgx", sourceURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	wait.For(t, 20*time.Second, "the write waiting for the move's lock", func() bool {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := m.Copy(ctx); err != nil {
		t.Fatal(errors.Join(err, m.Abort(context.WithoutCancel(ctx))))
	}
	if err := f.First().EndMoving(ctx, program, "run", "p1"); err != nil {
		t.Fatal(errors.Join(err, m.Abort(context.WithoutCancel(ctx))))
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	return <-done
}
