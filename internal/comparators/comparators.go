// Package comparators holds the approaches stockgate is benchmarked
// against, as HTTP handlers answering the same purchase call
// (POST /v1/skus/{program}/{ticket}/purchases: 201 sold, 409 sold out,
// 503 gave up). They live in the benchmark harness, never in the product:
//
//   - Bare: no stock at all, the HTTP ceiling (and BarePolls, the ceiling
//     of a waiting room's checks);
//   - Floor: one EVALSHA of a minimal deduct script, the physical floor of a
//     Redis gate;
//   - DecrIncr: DECR, then INCR back when it went negative (the seed
//     team-stock handler's first scheme);
//   - Lock: SET NX PX lock, GET, SET, compare-and-delete unlock (the seed lock
//     component around a read-modify-write);
//   - Optimistic: the ledger alone, read the version, conditional update,
//     retry on conflict (what the seeds fall back to).
//
// Each counts its 201s, so the benchmark can report oversell.
package comparators

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lua"
	"github.com/stockgate/stockgate/stock"
)

// The comparators' own Redis keys (kinds of keys.Bench).
var (
	benchdecr      = keys.MustID("decr")
	benchlock      = keys.MustID("lock")
	benchlockstock = keys.MustID("lockstock")
)

// Comparator is one approach, serving the purchase route.
type Comparator struct {
	Name    string
	Handler http.Handler
	Sold    atomic.Int64
	// Seed sets the SKU's stock before a run.
	Seed func(ctx context.Context, sku stock.SKU, stock int64) error
}

func engine(c *Comparator, buy func(ctx context.Context, sku stock.SKU) (int, error)) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.POST("/v1/skus/:program/:ticket/purchases", func(g *gin.Context) {
		var body struct {
			Buyer    string `json:"buyer"`
			Quantity int64  `json:"quantity"`
		}
		if err := g.ShouldBindJSON(&body); err != nil || body.Quantity != 1 {
			g.Status(http.StatusBadRequest)
			return
		}
		sku, err := stock.ParseSKU(g.Param("program"), g.Param("ticket"))
		if err != nil {
			g.Status(http.StatusBadRequest)
			return
		}
		code, err := buy(g.Request.Context(), sku)
		if err != nil {
			g.Status(http.StatusServiceUnavailable)
			return
		}
		if code == http.StatusCreated {
			c.Sold.Add(1)
		}
		g.Status(code)
	})
	e.GET("/v1/skus/:program/:ticket/stock", func(g *gin.Context) {
		g.JSON(http.StatusOK, gin.H{"remaining": 0})
	})
	return e
}

// BareName is Bare's name.
const BareName = "bare gin (no Redis)"

// Bare answers every purchase 201 without touching anything.
func Bare() *Comparator {
	c := &Comparator{Name: BareName, Seed: func(context.Context, stock.SKU, int64) error { return nil }}
	c.Handler = engine(c, func(context.Context, stock.SKU) (int, error) { return http.StatusCreated, nil })
	return c
}

// barePoll is what BarePolls answers: a waiting buyer's standing, the
// shape and size of the gateway's.
type barePoll struct {
	Program           string    `json:"program"`
	Buyer             string    `json:"buyer"`
	Ticket            string    `json:"ticket"`
	State             string    `json:"state"`
	Position          int64     `json:"position,omitempty"`
	Ahead             *int64    `json:"ahead,omitempty"`
	WaitSeconds       int64     `json:"estimated_wait_seconds"`
	OpensAt           time.Time `json:"opens_at"`
	RetryAfterSeconds int64     `json:"retry_after_seconds,omitempty"`
	AsOf              time.Time `json:"as_of"`
}

// BarePolls answers every waiting-room check (GET
// /v1/programs/:program/queue/:ticket) with a fixed standing, in the
// gateway's JSON shape, with Retry-After: the HTTP ceiling of a check that
// costs no Redis call, with no ticket to verify and no line to look up.
func BarePolls() http.Handler {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	opens := time.Now().UTC()
	e.GET("/v1/programs/:program/queue/:ticket", func(g *gin.Context) {
		ahead := int64(41)
		g.Header("Retry-After", "10")
		g.JSON(http.StatusOK, barePoll{Program: g.Param("program"), Buyer: "b", Ticket: g.Param("ticket"), State: "waiting",
			Position: 42, Ahead: &ahead, WaitSeconds: 42, OpensAt: opens, RetryAfterSeconds: 10, AsOf: time.Now().UTC()})
	})
	return e
}

const floorScript = `local a = tonumber(redis.call('HGET', KEYS[1], 'avail') or '0')
if a <= 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'avail', -1)
return 1`

// Floor is one EVALSHA of a minimal deduct script per purchase.
func Floor(rdb *redis.ClusterClient) *Comparator {
	script := redis.NewScript(floorScript)
	c := &Comparator{Name: "floor: one EVALSHA"}
	c.Seed = func(ctx context.Context, sku stock.SKU, units int64) error {
		return rdb.HSet(ctx, keys.Shard(sku.Program, sku.Ticket, 0, 1).Stock(), "avail", units).Err()
	}
	c.Handler = engine(c, func(ctx context.Context, sku stock.SKU) (int, error) {
		n, err := script.Run(ctx, rdb, []string{keys.Shard(sku.Program, sku.Ticket, 0, 1).Stock()}).Int64()
		if err != nil {
			return 0, err
		}
		if n == 1 {
			return http.StatusCreated, nil
		}
		return http.StatusConflict, nil
	})
	return c
}

// DecrIncr decrements, and increments back when the count went negative.
func DecrIncr(rdb *redis.ClusterClient) *Comparator {
	c := &Comparator{Name: "DECR + INCR on negative"}
	c.Seed = func(ctx context.Context, sku stock.SKU, units int64) error {
		return rdb.Set(ctx, keys.Bench(sku.Program, sku.Ticket, benchdecr), units, 0).Err()
	}
	c.Handler = engine(c, func(ctx context.Context, sku stock.SKU) (int, error) {
		k := keys.Bench(sku.Program, sku.Ticket, benchdecr)
		n, err := rdb.Decr(ctx, k).Result()
		if err != nil {
			return 0, err
		}
		if n < 0 {
			if err := rdb.Incr(ctx, k).Err(); err != nil {
				return 0, err
			}
			return http.StatusConflict, nil
		}
		return http.StatusCreated, nil
	})
	return c
}

// Lock takes a SET NX PX lock around GET and SET of the stock, waiting for
// it up to 50 times 1ms.
func Lock(rdb *redis.ClusterClient) *Comparator {
	unlock := redis.NewScript(lua.Unlock)
	c := &Comparator{Name: "SET NX PX lock + GET/SET"}
	c.Seed = func(ctx context.Context, sku stock.SKU, units int64) error {
		return rdb.Set(ctx, keys.Bench(sku.Program, sku.Ticket, benchlockstock), units, 0).Err()
	}
	c.Handler = engine(c, func(ctx context.Context, sku stock.SKU) (int, error) {
		lk, sk := keys.Bench(sku.Program, sku.Ticket, benchlock), keys.Bench(sku.Program, sku.Ticket, benchlockstock)
		var b [8]byte
		_, _ = rand.Read(b[:])
		token := hex.EncodeToString(b[:])
		for try := 0; ; try++ {
			ok, err := rdb.SetNX(ctx, lk, token, time.Second).Result()
			if err != nil {
				return 0, err
			}
			if ok {
				break
			}
			if try == 50 {
				return http.StatusServiceUnavailable, nil
			}
			time.Sleep(time.Millisecond)
		}
		defer unlock.Run(context.WithoutCancel(ctx), rdb, []string{lk}, token)
		v, err := rdb.Get(ctx, sk).Int64()
		if err != nil {
			return 0, err
		}
		if v <= 0 {
			return http.StatusConflict, nil
		}
		if err := rdb.Set(ctx, sk, strconv.FormatInt(v-1, 10), 0).Err(); err != nil {
			return 0, err
		}
		return http.StatusCreated, nil
	})
	return c
}

// Optimistic sells from a SQL table alone: read remaining and version,
// update where the version is unchanged and insert the order, retrying a
// conflict up to 10 times.
func Optimistic(db *sql.DB) (*Comparator, error) {
	_, err := db.Exec(`CREATE TABLE IF NOT EXISTS bench_stock (program TEXT, ticket TEXT, remaining BIGINT, version BIGINT,
		PRIMARY KEY (program, ticket));
		CREATE TABLE IF NOT EXISTS bench_orders (id BIGSERIAL PRIMARY KEY, program TEXT, ticket TEXT)`)
	if err != nil {
		return nil, err
	}
	c := &Comparator{Name: "ledger only, optimistic"}
	c.Seed = func(ctx context.Context, sku stock.SKU, units int64) error {
		_, err := db.ExecContext(ctx, `INSERT INTO bench_stock VALUES ($1, $2, $3, 0)
			ON CONFLICT (program, ticket) DO UPDATE SET remaining = $3, version = 0`, sku.Program, sku.Ticket, units)
		return err
	}
	c.Handler = engine(c, func(ctx context.Context, sku stock.SKU) (int, error) {
		for range 10 {
			var left, version int64
			if err := db.QueryRowContext(ctx, `SELECT remaining, version FROM bench_stock WHERE program = $1 AND ticket = $2`,
				sku.Program, sku.Ticket).Scan(&left, &version); err != nil {
				return 0, err
			}
			if left <= 0 {
				return http.StatusConflict, nil
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return 0, err
			}
			res, err := tx.ExecContext(ctx, `UPDATE bench_stock SET remaining = remaining - 1, version = version + 1
				WHERE program = $1 AND ticket = $2 AND version = $3`, sku.Program, sku.Ticket, version)
			if err != nil {
				tx.Rollback()
				return 0, err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				tx.Rollback()
				continue
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO bench_orders (program, ticket) VALUES ($1, $2)`, sku.Program, sku.Ticket); err != nil {
				tx.Rollback()
				return 0, err
			}
			if err := tx.Commit(); err != nil {
				return 0, err
			}
			return http.StatusCreated, nil
		}
		return 0, errors.New("conflicts")
	})
	return c, nil
}
