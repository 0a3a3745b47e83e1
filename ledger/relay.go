package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/stockgate/stockgate/keys"
)

// The relay's side of the ledger. Each sink (a webhook endpoint, a
// stream) reads the outbox by partition: a row per (sink, partition) keeps
// the seq delivered up to, the lease of the one relay that may deliver it,
// and the head event's failed attempts. A relay holds a partition by a
// lease it renews; every write of a partition's progress is fenced by that
// lease, so a relay that lost it (paused, partitioned away) cannot move a
// cursor another relay now owns. Events a sink gave up on are kept as dead
// letters until an admin has them redelivered.

// Partitions is how many relay partitions the outbox has.
const Partitions = eventPartitionCount

// ErrLeaseLost: the partition's lease is not (or no longer) the caller's.
// Nothing was written; stop delivering the partition.
var ErrLeaseLost = errors.New("ledger: relay lease lost")

// Claim is what a relay holds of a sink after ClaimPartitions.
type Claim struct {
	// Held are the partitions leased to the owner, until Until by the
	// ledger's lease clock (see leaseNow: on PostgreSQL, the database's).
	Held  []int
	Until time.Time
	// Share is the owner's fair share (the partitions over the live
	// relays, rounded up): a relay holding more gives the excess back.
	Share int
}

// ClaimPartitions renews the owner's leases on sink's partitions and takes
// free or expired ones up to its fair share, all until now + ttl.
func (l *Ledger) ClaimPartitions(ctx context.Context, sink, owner string, ttl time.Duration) (Claim, error) {
	if sink == "" || owner == "" || ttl <= 0 {
		return Claim{}, fmt.Errorf("ledger: claim partitions: sink, owner and ttl are required")
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return Claim{}, fmt.Errorf("ledger: claim partitions: %w", err)
	}
	defer tx.Rollback()
	nowMS, err := l.leaseNow(ctx, tx)
	if err != nil {
		return Claim{}, fmt.Errorf("ledger: claim partitions: %w", err)
	}
	untilMS := nowMS + ttl.Milliseconds()
	var have int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM relay_partitions WHERE sink = $1`, sink).Scan(&have); err != nil {
		return Claim{}, fmt.Errorf("ledger: claim partitions: %w", err)
	}
	if have < Partitions {
		vals, args := make([]string, Partitions), []any{sink}
		for p := range Partitions {
			vals[p] = fmt.Sprintf("($1, $%d)", len(args)+1)
			args = append(args, p)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO relay_partitions (sink, partition) VALUES `+strings.Join(vals, ", ")+
			` ON CONFLICT (sink, partition) DO NOTHING`, args...); err != nil {
			return Claim{}, fmt.Errorf("ledger: claim partitions: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO relay_owners (sink, owner, seen_until) VALUES ($1, $2, $3)
		ON CONFLICT (sink, owner) DO UPDATE SET seen_until = excluded.seen_until`, sink, owner, untilMS); err != nil {
		return Claim{}, fmt.Errorf("ledger: claim partitions: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM relay_owners WHERE sink = $1 AND seen_until < $2`, sink, nowMS); err != nil {
		return Claim{}, fmt.Errorf("ledger: claim partitions: %w", err)
	}
	var live int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM relay_owners WHERE sink = $1`, sink).Scan(&live); err != nil {
		return Claim{}, fmt.Errorf("ledger: claim partitions: %w", err)
	}
	c := Claim{Until: time.UnixMilli(untilMS), Share: (Partitions + live - 1) / live}
	// Mine, even if lapsed: nobody else took it since, so nobody moved it.
	held, err := queryInts(ctx, tx, `UPDATE relay_partitions SET lease_until = $3 WHERE sink = $1 AND owner = $2 RETURNING partition`,
		sink, owner, untilMS)
	if err != nil {
		return Claim{}, fmt.Errorf("ledger: claim partitions: %w", err)
	}
	if want := c.Share - len(held); want > 0 {
		// The condition is checked again on the row itself, so of two
		// relays claiming one partition at once one gets it.
		got, err := queryInts(ctx, tx, `UPDATE relay_partitions SET owner = $2, lease_until = $3
			WHERE sink = $1 AND lease_until <= $4 AND partition IN (
				SELECT partition FROM relay_partitions WHERE sink = $1 AND lease_until <= $4 ORDER BY partition LIMIT $5)
			AND lease_until <= $4 RETURNING partition`, sink, owner, untilMS, nowMS, want)
		if err != nil {
			return Claim{}, fmt.Errorf("ledger: claim partitions: %w", err)
		}
		held = append(held, got...)
	}
	if err := tx.Commit(); err != nil {
		return Claim{}, fmt.Errorf("ledger: claim partitions: %w", err)
	}
	c.Held = held
	return c, nil
}

func queryInts(ctx context.Context, tx *sql.Tx, q string, args ...any) ([]int, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// ReleasePartitions gives up the owner's leases on the partitions (all of
// them, and its place among the live relays, when none are named).
func (l *Ledger) ReleasePartitions(ctx context.Context, sink, owner string, partitions ...int) error {
	q, args := `UPDATE relay_partitions SET owner = '', lease_until = 0 WHERE sink = $1 AND owner = $2`, []any{sink, owner}
	if len(partitions) > 0 {
		q += ` AND partition IN ` + placeholders(2, len(partitions))
		for _, p := range partitions {
			args = append(args, p)
		}
	}
	if _, err := l.db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("ledger: release partitions: %w", err)
	}
	if len(partitions) == 0 {
		if _, err := l.db.ExecContext(ctx, `DELETE FROM relay_owners WHERE sink = $1 AND owner = $2`, sink, owner); err != nil {
			return fmt.Errorf("ledger: release partitions: %w", err)
		}
	}
	return nil
}

// RelayPartition is a partition's delivery state for one sink.
type RelayPartition struct {
	Sink       string
	Partition  int
	Delivered  int64 // the seq delivered up to
	Owner      string
	LeaseUntil time.Time
	Attempts   int       // the head event's failed attempts
	NextAt     time.Time // when the head event may be tried again
	LastError  string
}

// PartitionState reads a partition's state (ErrNotFound before the sink's
// first claim).
func (l *Ledger) PartitionState(ctx context.Context, sink string, partition int) (RelayPartition, error) {
	p := RelayPartition{Sink: sink, Partition: partition}
	var lease, next int64
	err := l.queryRowRepeated(ctx, `SELECT delivered_seq, owner, lease_until, attempts, next_at, last_error
		FROM relay_partitions WHERE sink = $1 AND partition = $2`, sink, partition).
		Scan(&p.Delivered, &p.Owner, &lease, &p.Attempts, &next, &p.LastError)
	if errors.Is(err, sql.ErrNoRows) {
		return p, ErrNotFound
	}
	if err != nil {
		return p, fmt.Errorf("ledger: partition state: %w", err)
	}
	p.LeaseUntil, p.NextAt = time.UnixMilli(lease), time.UnixMilli(next)
	return p, nil
}

// PartitionEvents reads up to limit of a partition's events with
// after < Seq <= upTo, in Seq order. upTo is a SettledSeq: no event at or
// below it can still appear.
func (l *Ledger) PartitionEvents(ctx context.Context, partition int, after, upTo int64, limit int) ([]Event, error) {
	rows, err := l.queryRepeated(ctx, `SELECT `+eventColumns+` FROM events
		WHERE partition = $1 AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4`, partition, after, upTo, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: partition events: %w", err)
	}
	defer rows.Close()
	return scanEvents(rows)
}

// PendingPartitions are the sink's partitions with events after their
// cursor, up to upTo.
func (l *Ledger) PendingPartitions(ctx context.Context, sink string, upTo int64) ([]int, error) {
	rows, err := l.queryRepeated(ctx, `SELECT r.partition FROM relay_partitions r WHERE r.sink = $1 AND EXISTS (
		SELECT 1 FROM events e WHERE e.partition = r.partition AND e.seq > r.delivered_seq AND e.seq <= $2)`, sink, upTo)
	if err != nil {
		return nil, fmt.Errorf("ledger: pending partitions: %w", err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			return nil, fmt.Errorf("ledger: pending partitions: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// leaseNow is the instant leases are written and judged by, in Unix ms: on
// PostgreSQL the database's clock, so that replicas whose clocks disagree
// still agree on whose lease has lapsed (a replica ahead of the others
// would otherwise take live leases); on SQLite, whose replicas share one
// host, this process's.
func (l *Ledger) leaseNow(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (int64, error) {
	if l.driver != Postgres {
		return l.now().UnixMilli(), nil
	}
	var ms int64
	err := q.QueryRowContext(ctx, `SELECT `+pgClockMS).Scan(&ms)
	return ms, err
}

// pgClockMS is PostgreSQL's clock in Unix ms, in SQL.
const pgClockMS = `CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)`

// leaseClock is the lease instant as SQL added to a parameter: the
// parameter is the instant itself on SQLite, and 0 on PostgreSQL, whose
// clock the expression reads (see leaseNow).
func (l *Ledger) leaseClock() (term string, param int64) {
	if l.driver == Postgres {
		return pgClockMS, 0
	}
	return "0", l.now().UnixMilli()
}

// fence is the condition of every write of a partition's progress: the
// owner holds the partition's unexpired lease ($4 + the clock term: see
// leaseClock).
func fence(clock string) string {
	return `sink = $1 AND partition = $2 AND owner = $3 AND lease_until > $4 + ` + clock
}

// fenced runs a fenced update (args after the fence's four) in tx, and
// reports ErrLeaseLost when it changed nothing.
func (l *Ledger) fenced(ctx context.Context, tx interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, set string, sink string, partition int, owner string, args ...any) error {
	clock, now := l.leaseClock()
	res, err := tx.ExecContext(ctx, `UPDATE relay_partitions SET `+set+` WHERE `+fence(clock),
		append([]any{sink, partition, owner, now}, args...)...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return ErrLeaseLost
	}
	return nil
}

// Advance records that the sink has the partition's events up to seq,
// and clears the head's attempts; ErrLeaseLost unless the owner holds
// the partition's lease.
func (l *Ledger) Advance(ctx context.Context, sink string, partition int, owner string, seq int64) error {
	err := l.fenced(ctx, l.db, `delivered_seq = $5, attempts = 0, next_at = 0, last_error = ''`, sink, partition, owner, seq)
	if err != nil {
		return fmt.Errorf("ledger: advance: %w", err)
	}
	return nil
}

// maxErrorText bounds a stored error: a receiver's answer can be long.
const maxErrorText = 500

func clip(s string) string {
	if len(s) > maxErrorText {
		return s[:maxErrorText]
	}
	return s
}

// RecordFailure records the head event's failed attempts, when it may be
// tried again and why it failed (fenced as Advance).
func (l *Ledger) RecordFailure(ctx context.Context, sink string, partition int, owner string, attempts int, next time.Time, why string) error {
	err := l.fenced(ctx, l.db, `attempts = $5, next_at = $6, last_error = $7`, sink, partition, owner,
		attempts, next.UnixMilli(), clip(why))
	if err != nil {
		return fmt.Errorf("ledger: record failure: %w", err)
	}
	return nil
}

// DeadLetter is an event a sink gave up on.
type DeadLetter struct {
	Sink      string
	Event     Event
	Attempts  int
	LastError string
	DeadAt    time.Time
}

// Bury dead-letters the partition's head event e after its attempts and
// moves the partition past it, in one transaction (fenced as Advance).
func (l *Ledger) Bury(ctx context.Context, sink string, owner string, e Event, attempts int, why string) error {
	now := l.now().UnixMilli()
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ledger: bury: %w", err)
	}
	defer tx.Rollback()
	if err := l.fenced(ctx, tx, `delivered_seq = $5, attempts = 0, next_at = 0, last_error = ''`, sink, e.Partition, owner, e.Seq); err != nil {
		return fmt.Errorf("ledger: bury: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO relay_dead (sink, seq, event_id, partition, attempts, last_error, dead_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (sink, seq) DO NOTHING`,
		sink, e.Seq, e.ID, e.Partition, attempts, clip(why), now); err != nil {
		return fmt.Errorf("ledger: bury: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("ledger: bury: %w", err)
	}
	return nil
}

const deadColumns = `d.sink, d.attempts, d.last_error, d.dead_at, e.seq, e.event_id, e.type, e.program, e.ticket, e.partition,
	e.subject, e.order_id, e.buyer, e.cart_id, e.quantity, e.to_ticket, e.created_at`

// DeadLetters reads up to limit of sink's dead letters with seq > after,
// in seq order.
func (l *Ledger) DeadLetters(ctx context.Context, sink string, after int64, limit int) ([]DeadLetter, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT `+deadColumns+` FROM relay_dead d JOIN events e ON e.seq = d.seq
		WHERE d.sink = $1 AND d.seq > $2 ORDER BY d.seq LIMIT $3`, sink, after, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: dead letters: %w", err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var d DeadLetter
		var to keys.ID
		var dead, at int64
		e := &d.Event
		if err := rows.Scan(&d.Sink, &d.Attempts, &d.LastError, &dead, &e.Seq, &e.ID, &e.Type, &e.SKU.Program, &e.SKU.Ticket,
			&e.Partition, &e.Subject, &e.Order, &e.Buyer, &e.Cart, &e.Quantity, &to, &at); err != nil {
			return nil, fmt.Errorf("ledger: dead letters: %w", err)
		}
		if !to.IsZero() {
			e.To.Program, e.To.Ticket = e.SKU.Program, to
		}
		e.At, d.DeadAt = time.UnixMilli(at).UTC(), time.UnixMilli(dead).UTC()
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: dead letters: %w", err)
	}
	return out, nil
}

// DeadLetter reads sink's dead letter of seq (ErrNotFound if none).
func (l *Ledger) DeadLetter(ctx context.Context, sink string, seq int64) (DeadLetter, error) {
	got, err := l.DeadLetters(ctx, sink, seq-1, 1)
	if err != nil {
		return DeadLetter{}, err
	}
	if len(got) == 0 || got[0].Event.Seq != seq {
		return DeadLetter{}, ErrNotFound
	}
	return got[0], nil
}

// ForgetDeadLetter removes sink's dead letter of seq, once redelivered
// (ErrNotFound if there is none).
func (l *Ledger) ForgetDeadLetter(ctx context.Context, sink string, seq int64) error {
	res, err := l.db.ExecContext(ctx, `DELETE FROM relay_dead WHERE sink = $1 AND seq = $2`, sink, seq)
	if err != nil {
		return fmt.Errorf("ledger: forget dead letter: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("ledger: forget dead letter: %w", err)
	} else if n == 0 {
		return ErrNotFound
	}
	return nil
}

// RelayStats are a sink's delivery figures.
type RelayStats struct {
	Sink string
	// Backlog is the events past their partitions' cursors; Oldest is
	// when the oldest of them was written (zero with no backlog).
	Backlog int64
	Oldest  time.Time
	Dead    int64 // dead letters kept
	Leased  int   // partitions under an unexpired lease
}

// RelayStats reads sink's figures.
func (l *Ledger) RelayStats(ctx context.Context, sink string) (RelayStats, error) {
	s := RelayStats{Sink: sink}
	var oldest sql.NullInt64
	if err := l.db.QueryRowContext(ctx, `SELECT COUNT(e.seq), MIN(e.created_at) FROM relay_partitions r
		JOIN events e ON e.partition = r.partition AND e.seq > r.delivered_seq WHERE r.sink = $1`, sink).Scan(&s.Backlog, &oldest); err != nil {
		return s, fmt.Errorf("ledger: relay stats: %w", err)
	}
	if oldest.Valid {
		s.Oldest = time.UnixMilli(oldest.Int64).UTC()
	}
	if err := l.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM relay_dead WHERE sink = $1`, sink).Scan(&s.Dead); err != nil {
		return s, fmt.Errorf("ledger: relay stats: %w", err)
	}
	clock, now := l.leaseClock()
	if err := l.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM relay_partitions WHERE sink = $1 AND lease_until > $2 + `+clock,
		sink, now).Scan(&s.Leased); err != nil {
		return s, fmt.Errorf("ledger: relay stats: %w", err)
	}
	return s, nil
}

// SettledSeq is a seq at or below which no event can still appear, for
// the relay to read partitions up to: it may then move a cursor past what
// it read without skipping anything.
//
// On SQLite it is unbounded: its one writer commits in seq order. On
// PostgreSQL a seq is taken at insert, not at commit, so a transaction
// still open may hold a seq below one already visible (two SKUs of a
// partition). The ledger therefore notes, at each call, the last seq
// handed out and then a transaction id of its own, taken after it: every
// transaction holding one of those seqs took its id before its seq (emit
// writes after the change's own rows), so a lower one. Once the oldest
// running transaction (the snapshot's xmin) is at or past the noted id,
// all of them have ended and the noted seq is settled: an event waits
// about one call's interval, longer only behind a long transaction.
//
// (Reading only events whose own transaction is older than xmin is not
// enough: a transaction may take its id first and its seq last, and
// commit while a younger one with a lower seq is still open.
// The snapshot's xmax is no bound either: it is the last completed id
// plus one, and running transactions may have ids above it.)
func (l *Ledger) SettledSeq(ctx context.Context) (int64, error) {
	settled, _, err := l.settledSeq(ctx)
	return settled, err
}

// settledSeq is SettledSeq and the last seq handed out, which it noted.
func (l *Ledger) settledSeq(ctx context.Context) (settled, last int64, err error) {
	if l.driver == SQLite {
		return math.MaxInt64, math.MaxInt64, nil
	}
	var seq sql.NullInt64
	if err := l.db.QueryRowContext(ctx, `SELECT pg_sequence_last_value(pg_get_serial_sequence('events', 'seq')::regclass)`).
		Scan(&seq); err != nil {
		return 0, 0, fmt.Errorf("ledger: settled seq: %w", err)
	}
	// A statement of its own, after the read above; it spends one
	// transaction id per call.
	var xid, xmin int64
	if err := l.db.QueryRowContext(ctx, `SELECT pg_current_xact_id()::text::bigint,
		pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&xid, &xmin); err != nil {
		return 0, 0, fmt.Errorf("ledger: settled seq: %w", err)
	}
	return l.horizon.settle(seq.Int64, xid, xmin), seq.Int64, nil
}

// feedWait bounds how long a read of the event feed at its tip waits for
// the events numbered below the last one handed out to commit: what a
// commit takes, many times over. Past it the read answers what is settled
// (a long transaction holds the feed back, never makes it skip).
const feedWait = 2 * time.Second

// waitSettled waits, feedWait at most, for the seqs up to last to settle
// (transactions holding one still open), re-reading only the snapshot's
// xmin, and returns how far they did.
func (l *Ledger) waitSettled(ctx context.Context, settled, last int64) (int64, error) {
	for pause, waited := time.Millisecond, time.Duration(0); settled < last && waited < feedWait; pause = min(2*pause, 100*time.Millisecond) {
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return settled, ctx.Err()
		case <-t.C:
		}
		waited += pause
		var xmin int64
		if err := l.db.QueryRowContext(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&xmin); err != nil {
			return settled, err
		}
		settled = l.horizon.advance(xmin)
	}
	return settled, nil
}

// horizon keeps the (seq, transaction id) notes SettledSeq waits on.
type horizon struct {
	mu      sync.Mutex
	settled int64
	pending []note
}

type note struct{ seq, xid int64 }

// maxNotes bounds the notes kept behind a long transaction; dropping the
// newest only delays.
const maxNotes = 64

func (h *horizon) settle(seq, xid, xmin int64) int64 {
	h.mu.Lock()
	if seq < h.settled {
		// The sequence went back: a standby promoted that had not
		// replayed all of it. What was settled, and the notes' ids, were
		// the old primary's.
		h.settled, h.pending = 0, h.pending[:0]
	}
	if len(h.pending) < maxNotes {
		h.pending = append(h.pending, note{seq, xid})
	}
	h.mu.Unlock()
	return h.advance(xmin)
}

// advance settles the notes whose transaction id the oldest running
// transaction (xmin) has passed.
func (h *horizon) advance(xmin int64) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	keep := h.pending[:0]
	for _, n := range h.pending {
		if xmin >= n.xid {
			h.settled = max(h.settled, n.seq)
		} else {
			keep = append(keep, n)
		}
	}
	h.pending = keep
	return h.settled
}
