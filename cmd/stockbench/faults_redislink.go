package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/stockgate/stockgate/e2e/netfault"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// linkMaster puts a fault proxy between the gateway and the cluster's
// first master (env.victim, env.rlink): the master announces the proxy's
// port as its own, so the gateway, a process of its own that learns the
// nodes from the cluster, reaches it only through the proxy, while the
// cluster's bus goes direct and sees nothing wrong. It returns the seed
// list without the master's own address, and what stops the proxy.
func (env *faultEnv) linkMaster(ctx context.Context) (seeds []string, stop func(), err error) {
	env.victim = env.c.Nodes[0] // masters come first
	link, err := netfault.New(env.victim.Addr)
	if err != nil {
		return nil, nil, err
	}
	_, p, err := net.SplitHostPort(link.Addr)
	port, perr := strconv.Atoi(p)
	if err == nil {
		err = perr
	}
	if err == nil {
		err = env.c.Announce(ctx, env.victim, port)
	}
	if err != nil {
		link.Stop()
		return nil, nil, err
	}
	env.rlink = link
	seeds = slices.DeleteFunc(env.c.Addrs(), func(a string) bool { return a == env.victim.Addr })
	return seeds, link.Stop, nil
}

// pickVictim makes the master of sku's shard the one a fault strikes,
// unless linkMaster chose it already.
func (env *faultEnv) pickVictim(ctx context.Context, sku stock.SKU) error {
	if env.victim != nil {
		return nil
	}
	var err error
	env.victim, err = env.c.MasterOf(ctx, keys.Shard(sku.Program, sku.Ticket, 0, 1).Slot())
	return err
}

// startGateway starts the fault's gateway on env's cluster and the
// ledger at dsn (through linkMaster's proxy for a Redis link's fault),
// and returns what stops it.
func (env *faultEnv) startGateway(ctx context.Context, bin, dsn string, f fault) (gateway, func(), error) {
	seeds, stopLink := env.c.Addrs(), func() {}
	if f.redisLink {
		var err error
		if seeds, stopLink, err = env.linkMaster(ctx); err != nil {
			return gateway{}, nil, err
		}
	}
	g, err := startGateway(ctx, bin, strings.Join(seeds, ","), dsn, "STOCKGATE_DRIFT_EVERY=2s")
	if err != nil {
		stopLink()
		return g, nil, err
	}
	return g, func() { g.cmd.Process.Kill(); _ = g.cmd.Wait(); stopLink() }, nil
}

// metricSum adds up the gateway's samples of the metric name whose
// labels include each of labels (`to="open"`).
func metricSum(base, name string, labels ...string) float64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		set, value, _ := strings.Cut(rest, "} ")
		if !all(labels, func(l string) bool { return strings.Contains(set, l) }) {
			continue
		}
		v, _ := strconv.ParseFloat(value, 64)
		sum += v
	}
	return sum
}

func all(xs []string, f func(string) bool) bool {
	for _, x := range xs {
		if !f(x) {
			return false
		}
	}
	return true
}

// linkLanded says whether a Redis link's fault reached the gateway, by
// its own metrics: breakers opened, and purchases sold around the gate
// (the ledger's fallback), between the two reads. A fault that never
// reached it (the gateway talking to the master directly) would measure
// nothing; that is an error, not a row.
type linkLanded struct{ opened, around float64 }

func readLanded(base string) linkLanded {
	return linkLanded{
		opened: metricSum(base, "stockgate_breaker_transitions_total", `to="open"`),
		around: metricSum(base, "stockgate_purchases_total", `path="ledger"`, `result="sold"`),
	}
}

func (l linkLanded) since(before linkLanded, name string) error {
	opened, around := l.opened-before.opened, l.around-before.around
	fmt.Fprintf(os.Stderr, "%s: breakers opened %.0f times, %.0f purchases sold around the gate\n", name, opened, around)
	if opened == 0 || around == 0 {
		return fmt.Errorf("the fault did not reach the gateway (breakers opened %.0f, sold around the gate %.0f)", opened, around)
	}
	return nil
}

// landed is nil unless f is a Redis link's fault that did not reach the
// gateway at base since before.
func (f fault) landed(base string, before linkLanded) error {
	if !f.redisLink {
		return nil
	}
	return readLanded(base).since(before, f.name)
}
