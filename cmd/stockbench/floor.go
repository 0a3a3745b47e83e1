package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// The ledger floor: the rows stockgate's ledger writes for each winner,
// written by a plain program with the best batching found, against the
// same schema (made by ledger.Open) and the same database, and nothing
// else: no HTTP, no Redis, no decisions. It is what this machine's
// database can do for stockgate's schema, the ceiling every ledger
// target is a fraction of.
//
// Per winner, as the ledger writes them: the request's row (with its
// ~300-byte stored answer), the order (or hold) row, the event; per SKU
// and batch, its row's update. (The buyer's count rows are written only
// under a cap, and the floor's SKUs, as the benchmark's, have none.) A
// confirm instead changes the hold's row and moves the SKU's units from
// held to sold. PostgreSQL: every table one set-based
// statement (unnest of arrays), all of a batch in one pipeline run as
// one implicit transaction: one round trip and one fsync per batch.
// SQLite: the same statements (json_each) in one transaction on its one
// connection, prepared once.

// floorConfig is one floor run.
type floorConfig struct {
	driver, dsn string
	kind        string // purchase, hold or confirm
	skus        int    // SKUs the winners spread over
	batch       int    // winners per transaction
	clients     int    // transactions at once (PostgreSQL), each on its own SKUs
	n           int    // winners in all
}

func (c floorConfig) String() string {
	return fmt.Sprintf("%s %s floor, %d SKU(s), %d per transaction, %d at once", c.driver, c.kind, c.skus, c.batch, c.clients)
}

// floorResult is what a floor run wrote.
type floorResult struct {
	config  floorConfig
	winners int
	elapsed time.Duration
	// ledgerCPU is the CPU seconds the database spent writing them (every
	// PostgreSQL process; for SQLite, the process writing, which is the
	// database): what the ledger's own work costs at the best batching.
	ledgerCPU float64
}

// ledgerMicros is the floor's database CPU per winner.
func (r floorResult) ledgerMicros() float64 { return r.ledgerCPU * 1e6 / float64(max(r.winners, 1)) }

func (r floorResult) perSecond() float64 { return float64(r.winners) / r.elapsed.Seconds() }

func floorCmd(args []string) error {
	fs := flag.NewFlagSet("floor", flag.ExitOnError)
	var c floorConfig
	fs.StringVar(&c.driver, "driver", ledger.Postgres, "postgres or sqlite")
	fs.StringVar(&c.dsn, "dsn", "", "an empty database's URL (postgres) or a new file's path (sqlite); required")
	fs.StringVar(&c.kind, "kind", "purchase", "purchase, hold or confirm")
	fs.IntVar(&c.skus, "skus", 100, "SKUs")
	fs.IntVar(&c.batch, "batch", 64, "winners per transaction")
	fs.IntVar(&c.clients, "clients", 4, "transactions at once (PostgreSQL)")
	fs.IntVar(&c.n, "n", 100_000, "winners")
	_ = fs.Parse(args)
	if c.dsn == "" {
		return badFlag("floor: -dsn is required")
	}
	r, err := runFloor(context.Background(), c)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %d winners in %v, %.0f/s\n", r.config, r.winners, r.elapsed.Round(time.Millisecond), r.perSecond())
	return nil
}

// runFloor makes the schema and the SKUs (and for confirms, the holds),
// then times the writes alone.
func runFloor(ctx context.Context, c floorConfig) (floorResult, error) {
	switch {
	case c.kind != "purchase" && c.kind != "hold" && c.kind != "confirm":
		return floorResult{}, fmt.Errorf("floor: kind %q: want purchase, hold or confirm", c.kind)
	case c.skus < 1 || c.batch < 1 || c.clients < 1 || c.n < 1:
		return floorResult{}, errors.New("floor: skus, batch, clients and n must be at least 1")
	}
	if c.driver == ledger.SQLite {
		c.clients = 1 // one writer
	}
	c.clients = min(c.clients, c.skus) // each client owns its SKUs
	l, err := ledger.Open(ctx, ledger.Options{Driver: c.driver, DSN: c.dsn})
	if err != nil {
		return floorResult{}, err
	}
	skus := make([]stock.SKU, c.skus)
	for i := range skus {
		skus[i] = stock.SKU{Program: keys.MustID(fmt.Sprintf("floor%d", i%10)), Ticket: keys.MustID(fmt.Sprintf("t%d", i))}
		if _, err := l.PutSKU(ctx, ledger.SKUConfig{SKU: skus[i], Total: int64(c.n) * 2, Shards: 1, MaxPerOrder: 4}); err != nil {
			l.Close()
			return floorResult{}, err
		}
	}
	l.Close()
	w, err := newFloorWriter(ctx, c)
	if err != nil {
		return floorResult{}, err
	}
	defer w.close()
	// Each client its own SKUs, its share of the winners, in batches.
	jobs := make([][][]floorRow, c.clients)
	for i := range c.n {
		cl := i % c.clients
		sku := skus[cl+c.clients*((i/c.clients)%max(c.skus/c.clients, 1))]
		r := floorRow{sku: sku, buyer: newHex(8), key: newHex(16), id: newHex(16), event: newHex(16), scope: newHex(8)}
		b := jobs[cl]
		if len(b) == 0 || len(b[len(b)-1]) == c.batch {
			b = append(b, nil)
		}
		b[len(b)-1] = append(b[len(b)-1], r)
		jobs[cl] = b
	}
	if c.kind == "confirm" { // the holds to confirm, untimed
		for _, batches := range jobs {
			for _, b := range batches {
				if err := w.write(ctx, "hold", b); err != nil {
					return floorResult{}, err
				}
			}
		}
	}
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	start := time.Now()
	for _, batches := range jobs {
		wg.Go(func() {
			for _, b := range batches {
				if err := w.write(ctx, c.kind, b); err != nil {
					failed.Store(&err)
					return
				}
			}
		})
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		return floorResult{}, *e
	}
	return floorResult{config: c, winners: c.n, elapsed: time.Since(start)}, nil
}

// floorRow is one winner's values.
type floorRow struct {
	sku                          stock.SKU
	buyer, key, id, event, scope string
}

// answer is a stored answer of the size the ledger stores (an order's).
func (r floorRow) answer() string {
	b, _ := json.Marshal(map[string]any{"o": map[string]any{"ID": r.id, "RequestID": r.key, "GateKey": "", "Program": r.sku.Program.String(),
		"Ticket": r.sku.Ticket.String(), "Buyer": r.buyer, "HoldID": "", "Quantity": 1, "CreatedAt": time.Now().UnixMilli(), "RefundedAt": 0}})
	return string(b)
}

func newHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// floorWriter writes batches of winners of one kind.
type floorWriter struct {
	driver  string
	pool    *pgxpool.Pool // PostgreSQL
	db      *sql.DB       // SQLite
	release func() error  // closes db
	stmts   map[string]*sql.Stmt
}

func newFloorWriter(ctx context.Context, c floorConfig) (*floorWriter, error) {
	w := &floorWriter{driver: c.driver}
	if c.driver == ledger.Postgres {
		cfg, err := pgxpool.ParseConfig(c.dsn)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(c.clients)
		if w.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return nil, err
		}
		return w, nil
	}
	// The ledger's own opening: its pragmas and its checkpointer.
	db, release, err := ledger.OpenSQLite(c.dsn)
	if err != nil {
		return nil, err
	}
	w.db, w.release, w.stmts = db, release, map[string]*sql.Stmt{}
	for _, kind := range []string{"purchase", "hold", "confirm"} {
		for _, q := range floorSQL(ledger.SQLite, kind).all() {
			if q != "" && w.stmts[q] == nil {
				if w.stmts[q], err = db.PrepareContext(ctx, q); err != nil {
					_ = release()
					return nil, fmt.Errorf("prepare %q: %w", q, err)
				}
			}
		}
	}
	return w, nil
}

func (w *floorWriter) close() {
	if w.pool != nil {
		w.pool.Close()
	}
	if w.db != nil {
		for _, st := range w.stmts {
			st.Close()
		}
		_ = w.release()
	}
}

// rows builds the statements' arguments for a batch: per driver, a column
// array each (PostgreSQL) or one JSON array of rows (SQLite).
type floorArgs struct {
	d    string
	cols [][]any
}

func (a *floorArgs) add(vals ...any) {
	if a.cols == nil {
		a.cols = make([][]any, len(vals))
	}
	for i, v := range vals {
		a.cols[i] = append(a.cols[i], v)
	}
}

func (a *floorArgs) args(first ...any) []any {
	if a.d == ledger.Postgres {
		out := first
		for _, col := range a.cols {
			switch col[0].(type) {
			case string:
				s := make([]string, len(col))
				for i, v := range col {
					s[i] = v.(string)
				}
				out = append(out, s)
			default:
				n := make([]int64, len(col))
				for i, v := range col {
					n[i] = v.(int64)
				}
				out = append(out, n)
			}
		}
		return out
	}
	rows := make([][]any, len(a.cols[0]))
	for i := range rows {
		for _, col := range a.cols {
			rows[i] = append(rows[i], col[i])
		}
	}
	b, _ := json.Marshal(rows)
	return append(first, string(b))
}

// floorStep is one statement of a batch and its arguments.
type floorStep struct {
	q    string
	args []any
}

// write writes one batch of kind in one transaction.
func (w *floorWriter) write(ctx context.Context, kind string, batch []floorRow) error {
	steps := floorSteps(w.driver, kind, batch)
	if w.driver == ledger.Postgres {
		b := &pgx.Batch{}
		for _, s := range steps {
			b.Queue(s.q, s.args...)
		}
		return w.pool.SendBatch(ctx, b).Close() // one implicit transaction
	}
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, s := range steps {
		if _, err := tx.StmtContext(ctx, w.stmts[s.q]).ExecContext(ctx, s.args...); err != nil {
			return fmt.Errorf("%s: %w", strings.Fields(s.q)[0], err)
		}
	}
	return tx.Commit()
}

// floorSteps is a batch's statements, in the order the ledger takes its
// rows: the holds (a confirm), the SKU rows, the requests, the order or
// hold rows, the events.
func floorSteps(d, kind string, batch []floorRow) []floorStep {
	now := time.Now().UnixMilli()
	qs := floorSQL(d, kind)
	sums := map[stock.SKU]int64{}
	for _, r := range batch {
		sums[r.sku]++
	}
	skus := floorArgs{d: d}
	for s, q := range sums {
		skus.add(s.Program.String(), s.Ticket.String(), q)
	}
	holds, reqs, rows, events := floorArgs{d: d}, floorArgs{d: d}, floorArgs{d: d}, floorArgs{d: d}
	for i, r := range batch {
		op, key, row := "purchase", r.key, r.id
		if kind == "confirm" {
			op, key, row = "confirm", "c"+r.key, "c"+r.id
			holds.add(r.id, row)
		}
		reqs.add(r.scope, key, "0123456789abcdef0123456789abcdef", op, r.sku.Program.String(), r.sku.Ticket.String(), r.answer())
		switch kind {
		case "purchase":
			rows.add(r.id, r.key, r.sku.Program.String(), r.sku.Ticket.String(), r.buyer, `[{"shards":4,"parts":[[1,1]]}]`)
		case "hold":
			rows.add(r.id, r.key, r.sku.Program.String(), r.sku.Ticket.String(), r.buyer, `[{"shards":4,"parts":[[1,1]]}]`, now+900_000)
		case "confirm":
			rows.add(r.id, row, r.sku.Program.String(), r.sku.Ticket.String(), r.buyer, "confirm-"+r.id)
		}
		events.add(newHex(16), r.sku.Program.String(), r.sku.Ticket.String(), int64(i%64), row, r.buyer)
	}
	var steps []floorStep
	if kind == "confirm" {
		steps = append(steps, floorStep{qs.holds, holds.args(now)})
	}
	steps = append(steps, floorStep{qs.skus, skus.args(now)}, floorStep{qs.requests, reqs.args(now)}, floorStep{qs.rows, rows.args(now)})
	return append(steps, floorStep{qs.events, events.args(now)})
}

// floorQueries are a kind's statements.
type floorQueries struct{ holds, skus, requests, rows, events string }

func (q floorQueries) all() []string { return []string{q.holds, q.skus, q.requests, q.rows, q.events} }

func floorSQL(d, kind string) floorQueries {
	from := func(first int, cols ...string) string { return floorRowsFrom(d, first, cols...) }
	column := map[string]string{"purchase": "sold = skus.sold + w.q", "hold": "held = skus.held + w.q",
		"confirm": "held = skus.held - w.q, sold = skus.sold + w.q"}[kind]
	q := floorQueries{
		holds: `UPDATE holds SET state = 'confirmed', ended_at = $1, order_id = w.order_id FROM ` +
			from(2, "id text", "order_id text") + ` WHERE holds.id = w.id AND holds.state = 'held'`,
		skus: `UPDATE skus SET ` + column + `, version = skus.version + 1, updated_at = $1 FROM ` +
			from(2, "program text", "ticket text", "q bigint") + ` WHERE skus.program = w.program AND skus.ticket = w.ticket`,
		requests: `INSERT INTO requests (scope, idem_key, fingerprint, op, program, ticket, result, sku_version, created_at)
			SELECT w.scope, w.idem_key, w.fp, w.op, w.program, w.ticket, w.result, 1, $1 FROM ` +
			from(2, "scope text", "idem_key text", "fp text", "op text", "program text", "ticket text", "result text") + ` WHERE true`,
		events: `INSERT INTO events (event_id, type, program, ticket, partition, subject, buyer, created_at)
			SELECT w.event_id, 'order.created', w.program, w.ticket, w.part, w.subject, w.buyer, $1 FROM ` +
			from(2, "event_id text", "program text", "ticket text", "part bigint", "subject text", "buyer text"),
	}
	switch kind {
	case "purchase":
		q.rows = `INSERT INTO orders (id, idem_key, request_hash, program, ticket, buyer, quantity, gate, created_at)
			SELECT w.id, w.idem_key, '', w.program, w.ticket, w.buyer, 1, w.gate, $1 FROM ` +
			from(2, "id text", "idem_key text", "program text", "ticket text", "buyer text", "gate text") + ` WHERE true`
	case "hold":
		q.rows = `INSERT INTO holds (id, idem_key, request_hash, program, ticket, buyer, quantity, gate, state, expires_at, created_at)
			SELECT w.id, w.idem_key, '', w.program, w.ticket, w.buyer, 1, w.gate, 'held', w.expires_at, $1 FROM ` +
			from(2, "id text", "idem_key text", "program text", "ticket text", "buyer text", "gate text", "expires_at bigint") + ` WHERE true`
	case "confirm":
		q.rows = `INSERT INTO orders (id, idem_key, request_hash, program, ticket, buyer, quantity, gate, gate_key, hold_id, created_at)
			SELECT w.order_id, w.idem_key, '', w.program, w.ticket, w.buyer, 1, '', '', w.hold_id, $1 FROM ` +
			from(2, "hold_id text", "order_id text", "program text", "ticket text", "buyer text", "idem_key text") + ` WHERE true`
	}
	return q
}

// floorRowsFrom is the FROM item of a statement's input rows, named w:
// unnest of one array per column (PostgreSQL), json_each of one JSON
// array of rows (SQLite). first numbers the first parameter they take.
func floorRowsFrom(d string, first int, cols ...string) string {
	names := make([]string, len(cols))
	var args []string
	for i, c := range cols {
		name, typ, _ := strings.Cut(c, " ")
		names[i] = name
		args = append(args, fmt.Sprintf("$%d::%s[]", first+i, typ))
	}
	if d == ledger.Postgres {
		return "unnest(" + strings.Join(args, ", ") + ") AS w(" + strings.Join(names, ", ") + ")"
	}
	sel := make([]string, len(names))
	for i, n := range names {
		sel[i] = fmt.Sprintf("value->>%d AS %s", i, n)
	}
	return fmt.Sprintf("(SELECT %s FROM json_each($%d)) AS w", strings.Join(sel, ", "), first)
}
