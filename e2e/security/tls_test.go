package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/ledger"
)

// stockgateACL is what the gateway's Redis user may do: its scripts (gate,
// quota, seats, locks), reading the cluster's shape, and the restock
// notices; nothing else. The README's managed-Redis section lists the same.
var stockgateACL = []string{"on", ">stockgate-test-password", "~*", "&*", "-@all",
	// The scripts, and what they call (ACLs apply inside scripts too).
	"+evalsha", "+eval", "+script|load",
	"+get", "+set", "+del", "+exists", "+pexpire",
	"+hget", "+hmget", "+hgetall", "+hset", "+hsetnx", "+hdel", "+hexists", "+hincrby",
	// The client: connecting, the cluster's shape, pool health checks.
	"+hello", "+auth", "+ping", "+client|setname", "+command", "+readonly",
	"+cluster|slots", "+cluster|shards", "+cluster|nodes", "+cluster|info", "+info",
	// Restock notices.
	"+publish", "+subscribe", "+unsubscribe"}

// The stock flow against a TLS-only cluster (clients, bus and replication
// encrypted), logged in as an ACL user that may run only the commands
// above: sales, holds, confirms, cancels, stock reads, a rebuild and a sold
// out all work, as with managed Redis that requires TLS and ACLs.
func TestTLSAndACL(t *testing.T) {
	c := testenv.NewCluster(t, testenv.ClusterOptions{TLS: true, Users: map[string][]string{"stockgate": stockgateACL}})
	t.Cleanup(func() {
		// What the ACL refused, when something failed: the command to add.
		if !t.Failed() {
			return
		}
		for _, n := range c.Nodes {
			cl := n.Client()
			entries, err := cl.Do(context.Background(), "ACL", "LOG", "10").Slice()
			cl.Close()
			t.Logf("ACL LOG of %s: %v %v", n.Addr, entries, err)
		}
	})
	e := startEnv(t, envOptions{driver: ledger.SQLite, cluster: c, sweep: true, drift: true, tune: func(o *app.Options) {
		o.Redis.Username, o.Redis.Password = "stockgate", "stockgate-test-password"
		o.Redis.TLS = cluster.TLS{Enabled: true, CAFile: c.TLS.CA}
	}})
	sku := newSKU(t)
	e.putSKU(t, sku, 6, 3, 4)
	for i := range 3 {
		if r := e.buy(t, sku, fmt.Sprintf("tls-buy-%d", i), fmt.Sprintf("tls-b%d", i), 1); r.status != http.StatusCreated {
			t.Fatalf("purchase %d over TLS = %d %s", i, r.status, r.body)
		}
	}
	ra, a := e.hold(t, sku, "tls-hold-a", "tls-ha", 1, 0)
	rb, b := e.hold(t, sku, "tls-hold-b", "tls-hb", 1, 0)
	if ra.status != http.StatusCreated || rb.status != http.StatusCreated {
		t.Fatalf("holds over TLS = %d %s, %d %s", ra.status, ra.body, rb.status, rb.body)
	}
	if r := e.act(t, "/v1/holds/"+a.HoldID+"/confirm", "tls-confirm", "tls-ha"); r.status != http.StatusCreated {
		t.Fatalf("confirm = %d %s", r.status, r.body)
	}
	if r := e.act(t, "/v1/holds/"+b.HoldID+"/cancel", "tls-cancel", "tls-hb"); r.status != http.StatusOK {
		t.Fatalf("cancel = %d %s", r.status, r.body)
	}
	// Two left in Redis, one of them the cancelled hold's, given back.
	bought := 0
	waitFor(t, 10*time.Second, "the last two tickets sold", func() bool {
		if r := e.buy(t, sku, fmt.Sprintf("tls-late-%d", bought), fmt.Sprintf("tls-l%d", bought), 1); r.status == http.StatusCreated {
			bought++
		}
		return bought == 2
	})
	if r := e.buy(t, sku, "tls-over", "tls-z", 1); r.status != http.StatusConflict {
		t.Fatalf("purchase of a sold-out SKU = %d %s, want 409", r.status, r.body)
	}
	// A rebuild already running (a purchase's outcome in Redis was unknown
	// on a busy machine, so the ledger sold it around the gate, whose
	// rebuild follows) answers 409 reseed-in-progress: sent again, as an
	// operator would, until this one runs.
	var rr reply
	waitFor(t, 10*time.Second, "the rebuild to run", func() bool {
		rr = e.do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/reconcile", nil, "")
		return !(rr.status == http.StatusConflict && strings.Contains(string(rr.body), "reseed-in-progress"))
	})
	if rr.status != http.StatusOK {
		t.Fatalf("rebuild over TLS = %d %s", rr.status, rr.body)
	}
	left, _, err := e.gate.Remaining(context.Background(), sku, 3)
	if err != nil || left != 0 {
		t.Errorf("Redis remaining %d (%v) after the sale, want 0", left, err)
	}
	if st := e.state(t, sku); st.Sold != 6 || st.Held != 0 {
		t.Errorf("ledger sold %d held %d, want 6 and 0", st.Sold, st.Held)
	}
	// The user really is limited: a command outside its list is refused.
	if err := e.rdb.FlushAll(context.Background()).Err(); err == nil {
		t.Error("the stockgate user may FLUSHALL: the ACL does not limit it")
	}
}
