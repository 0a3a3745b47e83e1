package testenv

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain stops the servers the tests started on first use (the shared
// PostgreSQL behind PgBouncerURL): without it the test binary's exit left
// the server's temp directory behind on every run.
func TestMain(m *testing.M) { os.Exit(Main(m)) }

func TestMasterRangesMatchRedisCli(t *testing.T) {
	// redis-cli --cluster create splits 3 masters as 0-5460, 5461-10922, 10923-16383.
	got := MasterRanges(3)
	want := []int{0, 5461, 10923, 16384}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("MasterRanges(3) = %v, want %v", got, want)
		}
	}
}

// TestClusterWithReplicas starts 3 masters + 3 replicas and checks the
// shape the failover tests rely on: every master has one replica.
func TestClusterWithReplicas(t *testing.T) {
	c := NewCluster(t, ClusterOptions{ReplicasPerMaster: 1})
	cl := c.Nodes[0].Client()
	defer cl.Close()
	nodes, err := cl.ClusterNodes(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	masters, replicas := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		switch {
		case strings.Contains(f[2], "master"):
			masters++
		case strings.Contains(f[2], "slave"):
			replicas++
			if f[3] == "-" {
				t.Errorf("replica without a master: %s", line)
			}
		}
	}
	if masters != 3 || replicas != 3 {
		t.Errorf("cluster has %d masters and %d replicas, want 3 and 3:\n%s", masters, replicas, nodes)
	}
	rc := c.Client()
	defer rc.Close()
	if err := rc.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Errorf("SET through the cluster client: %v", err)
	}
}

// The harness's PgBouncer pools by transaction: two clients, each holding
// its own connection to PgBouncer, run on one server connection (in session
// mode the second would wait for the first to hang up).
func TestPgBouncerPoolsByTransaction(t *testing.T) {
	bounced, _ := PgBouncerURL(t, PgBouncerOptions{PoolSize: 1})
	db, err := sql.Open("pgx", withParam(bounced, "default_query_exec_mode", "simple_protocol"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var pids [2]int
	for i := range pids {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pids[i]); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	if pids[0] != pids[1] {
		t.Fatalf("two clients on server backends %v with a pool of 1: not transaction pooling", pids)
	}
}
