package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/internal/testenv"
)

// readmeACL is the Redis ACL user docs/OPERATIONS.md's "Which Redis" section
// gives, as ACL SETUSER takes its rules (after the user's name), with the
// password in place of PASSWORD.
func readmeACL(t *testing.T, password string) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```\\s*\\n(ACL SETUSER stockgate .*?)```").FindSubmatch(b)
	if block == nil {
		t.Fatal("docs/OPERATIONS.md has no ``` block beginning ACL SETUSER stockgate")
	}
	rules := strings.Fields(string(block[1]))[3:]
	for i, r := range rules {
		if r == ">PASSWORD" {
			rules[i] = ">" + password
		}
	}
	return rules
}

// allowed reports whether rules let the user run command (lower case,
// "cluster|nodes" for a subcommand): docs/OPERATIONS.md grants commands one by one
// after -@all.
func allowed(rules []string, command string) bool {
	parent, _, _ := strings.Cut(command, "|")
	return slices.Contains(rules, "+"+command) || slices.Contains(rules, "+"+parent)
}

// Every command a Lua script calls is in the documented ACL user (ACLs apply
// inside scripts too): a new script's command cannot be forgotten there.
func TestReadmeACLCoversTheScripts(t *testing.T) {
	rules := readmeACL(t, "x")
	files, err := filepath.Glob("../../lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts under lua/: %v", err)
	}
	call := regexp.MustCompile(`redis\.p?call\(\s*(['"]?)([A-Za-z]*)`)
	seen := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllSubmatch(b, -1) {
			if len(m[1]) == 0 {
				t.Errorf("%s calls Redis with a computed command name: the ACL cannot be checked", f)
				continue
			}
			cmd := strings.ToLower(string(m[2]))
			seen[cmd] = true
			if !allowed(rules, cmd) {
				t.Errorf("%s calls %s, which the documented ACL user may not run", filepath.Base(f), strings.ToUpper(cmd))
			}
		}
	}
	if len(seen) < 10 {
		t.Errorf("found only %d commands in the scripts: %v", len(seen), seen)
	}
}

// A gateway logged in to Redis as exactly the documented ACL user sells,
// runs a waiting room (its pacer admits a buyer, who then buys) and adds
// every order's event to the Redis Streams sink, and Redis refuses it
// nothing (ACL LOG stays empty). With the user documented before, the pacer
// failed five times a second (buyers waited for ever while /readyz said
// ok) and the stream sink failed.
func TestReadmeACLRunsEverything(t *testing.T) {
	const password = "stockgate-readme-acl"
	c := testenv.NewCluster(t, testenv.ClusterOptions{ReplicasPerMaster: 1,
		Users: map[string][]string{"stockgate": readmeACL(t, password)}})
	aclLog := func() []string {
		var denied []string
		for _, n := range c.Nodes {
			cl := n.Client()
			entries, err := cl.ACLLog(context.Background(), 100).Result()
			cl.Close()
			if err != nil {
				t.Fatalf("ACL LOG on %s: %v", n.Addr, err)
			}
			for _, e := range entries {
				denied = append(denied, fmt.Sprintf("%s: %s %s %q (%s)", n.Addr, e.Username, e.Reason, e.Object, e.Context))
			}
		}
		return denied
	}
	const prefix = "stockgate:events:"
	srv := startServe(t, "STOCKGATE_REDIS_ADDRS="+strings.Join(c.Addrs(), ","),
		"STOCKGATE_REDIS_USERNAME=stockgate", "STOCKGATE_REDIS_PASSWORD="+password,
		"STOCKGATE_STREAM_PREFIX="+prefix, "STOCKGATE_LOG_LEVEL=warn")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log:\n%s\nACL LOG: %v", srv.logs.String(), aclLog())
		}
	})
	base := srv.base
	waitUntil(t, 20*time.Second, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	ctx := t.Context()
	gw, err := client.New(client.Options{BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	total, shards, maxPer := int64(10), 2, int64(4)
	sku := client.SKU{Program: testenv.ID(t, "acl"), Ticket: "ga"}
	if _, err := gw.PutSKU(ctx, sku, client.SKUConfig{Total: &total, Shards: &shards, MaxPerOrder: &maxPer}); err != nil {
		t.Fatalf("PutSKU: %v", err)
	}
	orders := 0
	for i := range 3 {
		if _, err := gw.Purchase(ctx, sku, client.Key(fmt.Sprintf("acl-buy-%d", i)), fmt.Sprintf("b%d", i), 1); err != nil {
			t.Fatalf("purchase %d: %v", i, err)
		}
		orders++
	}
	h, err := gw.Hold(ctx, sku, "acl-hold", "h1", 1, 0)
	if err != nil {
		t.Fatalf("hold: %v", err)
	}
	if _, err := gw.Confirm(ctx, h.HoldID, "acl-confirm", "h1"); err != nil {
		t.Fatalf("confirm: %v", err)
	}

	// The waiting room: its pacer (sorted sets, EXPIRE, INFO in scripts)
	// must admit the buyer, who then buys with the admission.
	queued := client.SKU{Program: testenv.ID(t, "aclq"), Ticket: "ga"}
	if _, err := gw.PutSKU(ctx, queued, client.SKUConfig{Total: &total, Shards: &shards, MaxPerOrder: &maxPer}); err != nil {
		t.Fatalf("PutSKU: %v", err)
	}
	now := int64(0)
	if _, err := gw.PutQueue(ctx, queued.Program, client.QueueConfig{OpensInSeconds: &now, RatePerSecond: 50,
		WindowSeconds: 120, PerRemaining: 2}); err != nil {
		t.Fatalf("PutQueue: %v", err)
	}
	st, err := gw.JoinQueue(ctx, queued.Program, "alice")
	if err != nil {
		t.Fatalf("JoinQueue: %v", err)
	}
	waitUntil(t, 30*time.Second, func() bool {
		if st, err = gw.CheckQueue(ctx, queued.Program, st.Ticket); err != nil {
			t.Fatalf("CheckQueue: %v", err)
		}
		return st.State != "waiting"
	})
	if st.State != "admitted" {
		t.Fatalf("the waiting room answered %q, want admitted", st.State)
	}
	if _, err := gw.Admitted(st.AdmissionToken).Purchase(ctx, queued, "acl-queued-buy", "alice", 1); err != nil {
		t.Fatalf("admitted purchase: %v", err)
	}
	orders++

	// The stream sink: every event of the sale in the streams, read as
	// the platform's consumer would (the default user).
	want := map[string]int{"order.created": orders, "hold.created": 1, "hold.confirmed": 1}
	rdb := c.Client()
	defer rdb.Close()
	var got map[string]int
	defer func() {
		if t.Failed() {
			t.Logf("events in the streams by type: %v, want %v", got, want)
		}
	}()
	waitUntil(t, 30*time.Second, func() bool {
		got = map[string]int{}
		for p := range 64 {
			entries, err := rdb.XRange(ctx, fmt.Sprintf("%s{%02d}", prefix, p), "-", "+").Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatalf("XRANGE: %v", err)
			}
			for _, e := range entries {
				got[fmt.Sprint(e.Values["type"])]++
			}
		}
		return maps.Equal(got, want)
	})
	if denied := aclLog(); len(denied) > 0 {
		t.Errorf("Redis refused the documented ACL user %d times:\n%s", len(denied), strings.Join(denied, "\n"))
	}
	// And the user is limited: what the gateway never runs is refused.
	user := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), Username: "stockgate", Password: password})
	defer user.Close()
	if err := user.FlushAll(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("FLUSHALL as the documented ACL user: %v, want NOPERM", err)
	}
}
