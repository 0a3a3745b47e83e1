package ledger

// The ledger's tables and indexes, all of them: the baseline migration
// (migrate.go) runs this DDL, written to run on every ledger made before.

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
)

const schema = `
CREATE TABLE IF NOT EXISTS skus (
	program       TEXT    NOT NULL,
	ticket        TEXT    NOT NULL,
	total         BIGINT  NOT NULL CHECK (total >= 0),
	sold          BIGINT  NOT NULL DEFAULT 0 CHECK (sold >= 0),
	held          BIGINT  NOT NULL DEFAULT 0 CHECK (held >= 0),
	version       BIGINT  NOT NULL DEFAULT 0,
	shards        INTEGER NOT NULL CHECK (shards >= 1),
	max_per_order BIGINT  NOT NULL CHECK (max_per_order >= 1),
	-- bypass_seq counts sales that went around the Redis gate (breaker
	-- fallback); gate_seq is the bypass_seq the gate was last rebuilt from.
	-- bypass_seq > gate_seq means Redis must be re-seeded before it serves
	-- the SKU again.
	bypass_seq    BIGINT  NOT NULL DEFAULT 0,
	gate_seq      BIGINT  NOT NULL DEFAULT 0,
	-- gate_epoch is the Redis gate's generation: every rebuild moves it on
	-- (under the row lock) before reading the facts it rebuilds from, and a
	-- request the gate admitted commits only at the epoch it was admitted
	-- under. So once a rebuild has moved the epoch, nothing admitted by the
	-- old gate can still commit, and the facts it read are final.
	gate_epoch    BIGINT  NOT NULL DEFAULT 0,
	-- per_buyer caps what one buyer holds + owns (0: no cap); ended_at > 0
	-- once an admin ended the sale; holds last hold_ttl_ms unless asked
	-- otherwise, at most hold_ttl_max_ms.
	per_buyer       BIGINT NOT NULL DEFAULT 0,
	ended_at        BIGINT NOT NULL DEFAULT 0,
	hold_ttl_ms     BIGINT NOT NULL DEFAULT 900000,
	hold_ttl_max_ms BIGINT NOT NULL DEFAULT 3600000,
	updated_at    BIGINT  NOT NULL,
	-- A pool's row (its ticket made by keys.Pooled): the stock allotted to
	-- it, sold in its window (0: no bound) to those its access rule lets in
	-- (pool_access '' open, 'code', 'channel' with pool_secret the SHA-256
	-- of the channel's credential); at its close its unsold stock moves
	-- into pool_into ('' the public stock), and pool_closed_at is set.
	pool_opens_at  BIGINT NOT NULL DEFAULT 0,
	pool_closes_at BIGINT NOT NULL DEFAULT 0,
	pool_access    TEXT   NOT NULL DEFAULT '',
	pool_secret    TEXT   NOT NULL DEFAULT '',
	pool_into      TEXT   NOT NULL DEFAULT '',
	pool_closed_at BIGINT NOT NULL DEFAULT 0,
	PRIMARY KEY (program, ticket),
	CHECK (sold + held <= total)
);
CREATE TABLE IF NOT EXISTS orders (
	id           TEXT   PRIMARY KEY,
	idem_key     TEXT   NOT NULL UNIQUE,
	request_hash TEXT   NOT NULL,
	program      TEXT   NOT NULL,
	ticket       TEXT   NOT NULL,
	buyer        TEXT   NOT NULL,
	quantity     BIGINT NOT NULL CHECK (quantity > 0),
	gate         TEXT   NOT NULL DEFAULT '',
	-- the request id whose Redis deduction records hold the stock: the
	-- order's own key, or the key of the hold it confirmed
	gate_key     TEXT   NOT NULL DEFAULT '',
	hold_id      TEXT   NOT NULL DEFAULT '',
	refunded_at  BIGINT NOT NULL DEFAULT 0,
	restore_pending INTEGER NOT NULL DEFAULT 0,
	-- the gate epoch the stock was taken under, and the one it came back
	-- under (see skus.gate_epoch): they decide whether Redis gets it back
	take_epoch    BIGINT NOT NULL DEFAULT 0,
	restore_epoch BIGINT NOT NULL DEFAULT 0,
	restore_shards INTEGER NOT NULL DEFAULT 1,
	-- the cart the order is a line of ('' for a single purchase)
	cart_id      TEXT   NOT NULL DEFAULT '',
	-- the access code it used (its hash; '' for none): one use while it stands
	code_hash    TEXT   NOT NULL DEFAULT '',
	created_at   BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS orders_sku ON orders (program, ticket);
CREATE TABLE IF NOT EXISTS holds (
	id              TEXT    PRIMARY KEY,
	idem_key        TEXT    NOT NULL UNIQUE,
	request_hash    TEXT    NOT NULL,
	program         TEXT    NOT NULL,
	ticket          TEXT    NOT NULL,
	buyer           TEXT    NOT NULL,
	quantity        BIGINT  NOT NULL CHECK (quantity > 0),
	gate            TEXT    NOT NULL DEFAULT '',
	state           TEXT    NOT NULL,
	expires_at      BIGINT  NOT NULL,
	order_id        TEXT    NOT NULL DEFAULT '',
	-- 1 from the moment the hold's stock came back in the ledger (cancel,
	-- expiry) until it is given back in Redis too: a sweeper that dies in
	-- between leaves the work here for the next one.
	restore_pending INTEGER NOT NULL DEFAULT 0,
	take_epoch      BIGINT  NOT NULL DEFAULT 0,
	restore_epoch   BIGINT  NOT NULL DEFAULT 0,
	restore_shards  INTEGER NOT NULL DEFAULT 1,
	-- the cart the hold is a line of ('' for a single hold)
	cart_id         TEXT    NOT NULL DEFAULT '',
	-- the access code it used (its hash; '' for none): one use while held
	code_hash       TEXT    NOT NULL DEFAULT '',
	created_at      BIGINT  NOT NULL,
	ended_at        BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS holds_expiry ON holds (state, expires_at);
-- Access codes of a pool (ticket is the pool's stock), stored hashed: each
-- with a use limit and, optionally, the one buyer who may use it. Uses are
-- not counted here but in the orders and holds that stand on the code, so
-- a refund, a cancel or an expiry gives its use back with its stock.
CREATE TABLE IF NOT EXISTS access_codes (
	program    TEXT    NOT NULL,
	ticket     TEXT    NOT NULL,
	code_hash  TEXT    NOT NULL,
	max_uses   BIGINT  NOT NULL CHECK (max_uses >= 1),
	buyer      TEXT    NOT NULL DEFAULT '',
	created_at BIGINT  NOT NULL,
	PRIMARY KEY (program, ticket, code_hash)
);
-- Reserved seating: a SKU's seat map, each seat free, held by one hold, or
-- sold through one.
CREATE TABLE IF NOT EXISTS seats (
	program   TEXT    NOT NULL,
	ticket    TEXT    NOT NULL,
	seat_id   TEXT    NOT NULL,
	section   TEXT    NOT NULL,
	row_label TEXT    NOT NULL,
	number    INTEGER NOT NULL,
	state     TEXT    NOT NULL DEFAULT 'free',
	hold_id   TEXT    NOT NULL DEFAULT '',
	PRIMARY KEY (program, ticket, seat_id)
);
CREATE INDEX IF NOT EXISTS seats_hold ON seats (hold_id);
-- A cap on what one buyer may hold + own of all of a program's tickets.
CREATE TABLE IF NOT EXISTS programs (
	program   TEXT   PRIMARY KEY,
	per_buyer BIGINT NOT NULL CHECK (per_buyer >= 0)
);
-- Every client request that changed something, by its Idempotency-Key
-- within its scope (the buyer), with the fingerprint of what it asked and
-- the answer it got, written in the transaction of the change itself.
-- sku_version is the SKU row version that transaction produced, in commit
-- order per SKU, so a replica can read "what committed since".
CREATE TABLE IF NOT EXISTS requests (
	scope       TEXT   NOT NULL,
	idem_key    TEXT   NOT NULL,
	fingerprint TEXT   NOT NULL,
	op          TEXT   NOT NULL,
	program     TEXT   NOT NULL,
	ticket      TEXT   NOT NULL,
	result      TEXT   NOT NULL DEFAULT '',
	sku_version BIGINT NOT NULL DEFAULT 0,
	created_at  BIGINT NOT NULL,
	PRIMARY KEY (scope, idem_key)
);
CREATE INDEX IF NOT EXISTS requests_sku ON requests (program, ticket, sku_version);
-- What each buyer holds + owns of each SKU, for the per-buyer caps; the
-- row with ticket '' counts the whole program.
CREATE TABLE IF NOT EXISTS buyer_units (
	program TEXT   NOT NULL,
	ticket  TEXT   NOT NULL,
	buyer   TEXT   NOT NULL,
	units   BIGINT NOT NULL CHECK (units >= 0),
	PRIMARY KEY (program, ticket, buyer)
);
`

// added lists the columns added after the first release, for ledgers
// created before.
var added = []struct{ table, name, def string }{
	{"skus", "bypass_seq", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "gate_seq", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "per_buyer", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "ended_at", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "hold_ttl_ms", "BIGINT NOT NULL DEFAULT 900000"},
	{"skus", "hold_ttl_max_ms", "BIGINT NOT NULL DEFAULT 3600000"},
	{"holds", "seat_ids", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "seated", "INTEGER NOT NULL DEFAULT 0"},
	{"orders", "gate_key", "TEXT NOT NULL DEFAULT ''"},
	{"orders", "hold_id", "TEXT NOT NULL DEFAULT ''"},
	{"orders", "refunded_at", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "restore_pending", "INTEGER NOT NULL DEFAULT 0"},
	{"skus", "gate_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "take_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "restore_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "restore_shards", "INTEGER NOT NULL DEFAULT 1"},
	{"holds", "take_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"holds", "restore_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"holds", "restore_shards", "INTEGER NOT NULL DEFAULT 1"},
	{"orders", "cart_id", "TEXT NOT NULL DEFAULT ''"},
	{"holds", "cart_id", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "pool_opens_at", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "pool_closes_at", "BIGINT NOT NULL DEFAULT 0"},
	{"skus", "pool_access", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "pool_secret", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "pool_into", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "pool_closed_at", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "code_hash", "TEXT NOT NULL DEFAULT ''"},
	{"holds", "code_hash", "TEXT NOT NULL DEFAULT ''"},
	{"orders", "seat_ids", "TEXT NOT NULL DEFAULT ''"},
	{"skus", "wait_seq", "BIGINT NOT NULL DEFAULT 0"},
	{"holds", "offered", "BIGINT NOT NULL DEFAULT 0"},
	{"orders", "offered", "BIGINT NOT NULL DEFAULT 0"},
}

// laterTables are the tables added after the first release, each with its
// own indexes: the outbox, the relay's partitions, the waitlist.
func laterTables(driver string) string {
	return eventsTable(driver) + relayTables(driver) + waitlistTables(driver) + queueTables(driver) + `
-- The ledger's own random id, made when it was first migrated: what the
-- replicas of one ledger name their shared Redis locks by, apart from
-- another ledger's on the same Redis.
CREATE TABLE IF NOT EXISTS ledger_identity (id TEXT NOT NULL);
`
}

// addedIndexes index columns of added: they run after the columns are
// added, so a ledger whose tables predate the columns migrates (CREATE
// INDEX on a column not there yet fails the whole migration).
//
// The cart and code indexes hold only the rows that have one: most
// orders and holds are neither a cart's line nor on a code, and an entry
// each would be written for nothing (the queries test for a non-empty
// value, so both databases use them). The owed indexes hold only the returns Redis is
// still owed, which the sweepers look for every second: without one on
// orders, each look read every order (94 ms a look after 60,000 orders).
const addedIndexes = `
DROP INDEX IF EXISTS orders_cart;
DROP INDEX IF EXISTS holds_cart;
DROP INDEX IF EXISTS holds_code;
DROP INDEX IF EXISTS orders_code;
CREATE INDEX IF NOT EXISTS orders_in_cart ON orders (cart_id) WHERE cart_id <> '';
CREATE INDEX IF NOT EXISTS holds_in_cart ON holds (cart_id) WHERE cart_id <> '';
CREATE INDEX IF NOT EXISTS holds_on_code ON holds (code_hash) WHERE code_hash <> '';
CREATE INDEX IF NOT EXISTS orders_on_code ON orders (code_hash) WHERE code_hash <> '';
DROP INDEX IF EXISTS holds_pending;
CREATE INDEX IF NOT EXISTS holds_owed ON holds (ended_at) WHERE restore_pending > 0;
CREATE INDEX IF NOT EXISTS orders_owed ON orders (refunded_at) WHERE restore_pending > 0;
`

// schemaDigest names the schema of the baseline step. The builds from
// before versioned migrations start only on a ledger that carries it, so the
// baseline keeps writing it (see baseline).
var schemaDigest = func() string {
	h := sha256.New()
	h.Write([]byte(schema))
	h.Write([]byte(addedIndexes))
	h.Write([]byte(laterTables(SQLite) + laterTables(Postgres)))
	for _, c := range added {
		fmt.Fprintf(h, "\x00%s.%s %s", c.table, c.name, c.def)
	}
	return hex.EncodeToString(h.Sum(nil))
}()

// addColumn adds a column unless the table has it. SQLite has no ADD
// COLUMN IF NOT EXISTS, so both drivers look first.
func (l *Ledger) addColumn(ctx context.Context, tx *sql.Tx, table, name, def string) error {
	q := `SELECT COUNT(*) FROM information_schema.columns WHERE table_name = $1 AND column_name = $2`
	if l.driver == SQLite {
		q = `SELECT COUNT(*) FROM pragma_table_info($1) WHERE name = $2`
	}
	var n int
	if err := tx.QueryRowContext(ctx, q, table, name).Scan(&n); err != nil {
		return fmt.Errorf("look for column %s.%s: %w", table, name, err)
	}
	if n > 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, "ALTER TABLE "+table+" ADD COLUMN "+name+" "+def)
	return err
}

// eventsTable is the outbox's table: its sequence is the one thing the
// drivers spell differently.
func eventsTable(driver string) string {
	seq := "seq BIGSERIAL PRIMARY KEY"
	if driver == SQLite {
		seq = "seq INTEGER PRIMARY KEY AUTOINCREMENT"
	}
	return `CREATE TABLE IF NOT EXISTS events (
	` + seq + `,
	event_id   TEXT    NOT NULL UNIQUE,
	type       TEXT    NOT NULL,
	program    TEXT    NOT NULL,
	ticket     TEXT    NOT NULL,
	partition  INTEGER NOT NULL,
	subject    TEXT    NOT NULL DEFAULT '',
	order_id   TEXT    NOT NULL DEFAULT '',
	buyer      TEXT    NOT NULL DEFAULT '',
	cart_id    TEXT    NOT NULL DEFAULT '',
	quantity   BIGINT  NOT NULL DEFAULT 0,
	to_ticket  TEXT    NOT NULL DEFAULT '',
	created_at BIGINT  NOT NULL
);
CREATE INDEX IF NOT EXISTS events_partition ON events (partition, seq);
CREATE INDEX IF NOT EXISTS events_program ON events (program, seq);
`
}

// relayTables are the relay's tables (partition leases and cursors, the
// live relays per sink, dead letters).
func relayTables(driver string) string {
	return `CREATE TABLE IF NOT EXISTS relay_partitions (
	sink          TEXT    NOT NULL,
	partition     INTEGER NOT NULL,
	-- the seq the sink has the partition's events up to
	delivered_seq BIGINT  NOT NULL DEFAULT 0,
	-- the relay delivering the partition, until lease_until (ms)
	owner         TEXT    NOT NULL DEFAULT '',
	lease_until   BIGINT  NOT NULL DEFAULT 0,
	-- the head event's failed attempts, when it may be tried again (ms),
	-- and why the last one failed
	attempts      INTEGER NOT NULL DEFAULT 0,
	next_at       BIGINT  NOT NULL DEFAULT 0,
	last_error    TEXT    NOT NULL DEFAULT '',
	PRIMARY KEY (sink, partition)
);
-- The relays alive per sink (each renews its row with its leases), so
-- that each takes its fair share of the partitions.
CREATE TABLE IF NOT EXISTS relay_owners (
	sink       TEXT   NOT NULL,
	owner      TEXT   NOT NULL,
	seen_until BIGINT NOT NULL,
	PRIMARY KEY (sink, owner)
);
CREATE TABLE IF NOT EXISTS relay_dead (
	sink       TEXT    NOT NULL,
	seq        BIGINT  NOT NULL,
	event_id   TEXT    NOT NULL,
	partition  INTEGER NOT NULL,
	attempts   INTEGER NOT NULL,
	last_error TEXT    NOT NULL,
	dead_at    BIGINT  NOT NULL,
	PRIMARY KEY (sink, seq)
);
`
}

func waitlistTables(driver string) string {
	return `CREATE TABLE IF NOT EXISTS waitlist (
	program      TEXT   NOT NULL,
	ticket       TEXT   NOT NULL,
	buyer        TEXT   NOT NULL,
	seq          BIGINT NOT NULL,
	quantity     BIGINT NOT NULL CHECK (quantity >= 1),
	state        TEXT   NOT NULL,
	offer_ttl_ms BIGINT NOT NULL,
	hold_id      TEXT   NOT NULL DEFAULT '',
	joined_at    BIGINT NOT NULL,
	updated_at   BIGINT NOT NULL,
	PRIMARY KEY (program, ticket, buyer)
);
CREATE INDEX IF NOT EXISTS waitlist_line ON waitlist (program, ticket, state, seq);
`
}

func queueTables(driver string) string {
	return `CREATE TABLE IF NOT EXISTS queues (
	program       TEXT   PRIMARY KEY,
	opens_at      BIGINT NOT NULL,
	join_from     BIGINT NOT NULL,
	rate          BIGINT NOT NULL,
	window_ms     BIGINT NOT NULL,
	per_remaining BIGINT NOT NULL,
	secret        TEXT   NOT NULL,
	checkout_url  TEXT   NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS queue_places (
	program      TEXT   NOT NULL,
	room         TEXT   NOT NULL,
	pre_cap      BIGINT NOT NULL DEFAULT 0,
	post_cap     BIGINT NOT NULL DEFAULT 0,
	opened       BIGINT NOT NULL DEFAULT 0,
	early        BIGINT NOT NULL DEFAULT 0,
	post_seen    BIGINT NOT NULL DEFAULT 0,
	serving_seen BIGINT NOT NULL DEFAULT 0,
	old_seen     BIGINT NOT NULL DEFAULT 0,
	perm         BIGINT NOT NULL DEFAULT 0,
	egap_hi      BIGINT NOT NULL DEFAULT 0,
	PRIMARY KEY (program, room)
);
CREATE TABLE IF NOT EXISTS queue_spends (
	program  TEXT   NOT NULL,
	room     TEXT   NOT NULL,
	buyer    TEXT   NOT NULL,
	position BIGINT NOT NULL,
	request  TEXT   NOT NULL,
	PRIMARY KEY (program, room, buyer)
);
`
}
