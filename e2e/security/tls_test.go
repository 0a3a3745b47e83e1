package security_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/cluster"
	"github.com/stockgate/stockgate/e2e/systest"
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
	e := systest.Start(t, systest.Options{Driver: ledger.SQLite, Cluster: c, Sweep: true, Drift: true, Tune: func(o *app.Options) {
		o.Redis.Username, o.Redis.Password = "stockgate", "stockgate-test-password"
		o.Redis.TLS = cluster.TLS{Enabled: true, CAFile: c.TLS.CA}
	}})
	sku := systest.NewSKU(t)
	e.PutSKU(t, sku, 6, 3, 4)
	for i := range 3 {
		if r := e.Buy(t, sku, fmt.Sprintf("tls-buy-%d", i), fmt.Sprintf("tls-b%d", i), 1); r.Status != http.StatusCreated {
			t.Fatalf("purchase %d over TLS = %d %s", i, r.Status, r.Body)
		}
	}
	ra, a := e.Hold(t, sku, "tls-hold-a", "tls-ha", 1, 0)
	rb, b := e.Hold(t, sku, "tls-hold-b", "tls-hb", 1, 0)
	if ra.Status != http.StatusCreated || rb.Status != http.StatusCreated {
		t.Fatalf("holds over TLS = %d %s, %d %s", ra.Status, ra.Body, rb.Status, rb.Body)
	}
	if r := e.Act(t, "/v1/holds/"+a.HoldID+"/confirm", "tls-confirm", "tls-ha"); r.Status != http.StatusCreated {
		t.Fatalf("confirm = %d %s", r.Status, r.Body)
	}
	if r := e.Act(t, "/v1/holds/"+b.HoldID+"/cancel", "tls-cancel", "tls-hb"); r.Status != http.StatusOK {
		t.Fatalf("cancel = %d %s", r.Status, r.Body)
	}
	// Two left in Redis, one of them the cancelled hold's, given back.
	bought := 0
	systest.WaitFor(t, 10*time.Second, "the last two tickets sold", func() bool {
		if r := e.Buy(t, sku, fmt.Sprintf("tls-late-%d", bought), fmt.Sprintf("tls-l%d", bought), 1); r.Status == http.StatusCreated {
			bought++
		}
		return bought == 2
	})
	if r := e.Buy(t, sku, "tls-over", "tls-z", 1); r.Status != http.StatusConflict {
		t.Fatalf("purchase of a sold-out SKU = %d %s, want 409", r.Status, r.Body)
	}
	// A rebuild already running (a purchase's outcome in Redis was unknown
	// on a busy machine, so the ledger sold it around the gate, whose
	// rebuild follows) answers 409 reseed-in-progress: sent again, as an
	// operator would, until this one runs.
	var rr systest.Reply
	systest.WaitFor(t, 10*time.Second, "the rebuild to run", func() bool {
		rr = e.Do(t, http.MethodPost, "/v1/admin/skus/"+sku.Program.String()+"/"+sku.Ticket.String()+"/reconcile", nil, "")
		return !(rr.Status == http.StatusConflict && strings.Contains(string(rr.Body), "reseed-in-progress"))
	})
	if rr.Status != http.StatusOK {
		t.Fatalf("rebuild over TLS = %d %s", rr.Status, rr.Body)
	}
	left, _, err := e.Gate.Remaining(context.Background(), sku, 3)
	if err != nil || left != 0 {
		t.Errorf("Redis remaining %d (%v) after the sale, want 0", left, err)
	}
	if st := e.State(t, sku); st.Sold != 6 || st.Held != 0 {
		t.Errorf("ledger sold %d held %d, want 6 and 0", st.Sold, st.Held)
	}
	// The user really is limited: a command outside its list is refused.
	if err := e.Redis.FlushAll(context.Background()).Err(); err == nil {
		t.Error("the stockgate user may FLUSHALL: the ACL does not limit it")
	}
}
