package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/stockgate/stockgate/e2e/loadgen"
	"github.com/stockgate/stockgate/internal/testenv"
)

// compareCmd runs the flash sale and the sold-out storm (or the runs named
// by -runs: flash, steady, storm, holds, confirms, cancels, carts) through two builds
// of stockgate side by side, on one Redis Cluster and one PostgreSQL, in
// interleaved rounds (old, new, then new, old, ...), and prints each
// round's throughput and the median and range of new/old. This machine
// varies ±20 % between runs; within one run, interleaving puts both
// builds under the same conditions.
//
//	stockbench compare -base 209a591 -rounds 3
func compareCmd(args []string) error {
	fs := flag.NewFlagSet("compare", flag.ExitOnError)
	base := fs.String("base", "HEAD~1", "git revision of the old build")
	var c comparison
	fs.Uint64Var(&c.n, "n", 100_000, "requests of each run")
	fs.Uint64Var(&c.workers, "workers", 64, "concurrent connections of each run")
	rounds := fs.Int("rounds", 3, "rounds of each comparison")
	dir := fs.String("dir", ".run/compare", "working directory (builds, charts)")
	only := fs.String("runs", "flash,storm", "runs to compare: flash, steady, storm, holds, confirms, cancels, carts")
	_ = fs.Parse(args)
	ctx := context.Background()
	var runs []compareRun
	for _, r := range c.runs() {
		if slices.Contains(strings.Split(*only, ","), r.key) {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return fmt.Errorf("-runs %q names no run (flash, steady, storm, holds, confirms, cancels, carts)", *only)
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	var err error
	if c.dir, err = filepath.Abs(*dir); err != nil {
		return err
	}
	bins, cleanup, err := c.build(*base)
	defer cleanup()
	if err != nil {
		return err
	}
	cl, err := testenv.StartCluster(ctx, testenv.ClusterOptions{ReplicasPerMaster: 1})
	if err != nil {
		return err
	}
	defer cl.Stop()
	pg, err := testenv.StartDurablePostgres(ctx)
	if err != nil {
		return err
	}
	defer pg.Stop()
	c.gws = map[string]gateway{}
	for _, name := range []string{"old", "new"} {
		dsn, _, err := pg.NewDatabase(ctx)
		if err != nil {
			return err
		}
		g, err := startGateway(ctx, bins[name], strings.Join(cl.Addrs(), ","), dsn, "")
		if err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		defer func() { g.cmd.Process.Kill(); _ = g.cmd.Wait() }()
		c.gws[name] = g
	}
	fmt.Printf("# %s (old) against the working tree (new): %d requests from %d connections per run, %d interleaved rounds\n\n",
		*base, c.n, c.workers, *rounds)
	fmt.Println("| run | round | old req/s | new req/s | new/old |")
	fmt.Println("|---|---|---|---|---|")
	for _, r := range runs {
		var ratios []float64
		for round := range *rounds {
			was, is, err := c.round(r, round)
			if err != nil {
				return err
			}
			ratios = append(ratios, is/was)
			fmt.Printf("| %s | %d | %.0f | %.0f | %.2f |\n", r.name, round+1, was, is, is/was)
		}
		slices.Sort(ratios)
		fmt.Printf("| %s | median (range) | | | **%.2f** (%.2f–%.2f) |\n", r.name, ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
	}
	return nil
}

// comparison is one compare: its runs' size, its directory and the two
// gateways, "old" and "new".
type comparison struct {
	n, workers uint64
	dir        string
	gws        map[string]gateway
}

// compareRun is one run compare can make: make readies it on a gateway,
// in a program of its own, and returns its requests.
type compareRun struct {
	key, name string
	make      func(g gateway, prog string) (loadgen.Scenario, error)
}

// build builds base (in a worktree of its own) and the working tree; it
// returns the binaries by "old" and "new", and what removes the worktree.
func (c *comparison) build(base string) (map[string]string, func(), error) {
	oldSrc := filepath.Join(c.dir, "old-src")
	_ = exec.Command("git", "worktree", "remove", "--force", oldSrc).Run()
	if out, err := exec.Command("git", "worktree", "add", "--detach", oldSrc, base).CombinedOutput(); err != nil {
		return nil, func() {}, fmt.Errorf("git worktree add %s: %v: %s", base, err, out)
	}
	cleanup := func() { _ = exec.Command("git", "worktree", "remove", "--force", oldSrc).Run() }
	bins := map[string]string{"old": filepath.Join(c.dir, "stockgate-old"), "new": filepath.Join(c.dir, "stockgate-new")}
	fmt.Fprintf(os.Stderr, "building %s and the working tree\n", base)
	for _, name := range []string{"old", "new"} {
		src := map[string]string{"old": oldSrc, "new": "."}[name]
		cmd := exec.Command("go", "build", "-o", bins[name], "./cmd/stockgate")
		cmd.Dir = src
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, cleanup, fmt.Errorf("build in %s: %v: %s", src, err, b)
		}
	}
	return bins, cleanup, nil
}

// round runs r once on each gateway, old first in an even round and new
// first in an odd one, and returns each one's requests a second.
func (c *comparison) round(r compareRun, round int) (was, is float64, err error) {
	order := []string{"old", "new"}
	if round%2 == 1 {
		order = []string{"new", "old"}
	}
	got := map[string]float64{}
	for _, name := range order {
		prog := fmt.Sprintf("cmp%s%d%s", slug(r.name)[:5], round, name)
		prog = strings.ReplaceAll(prog, "-", "")
		sc, err := r.make(c.gws[name], prog)
		if err != nil {
			return 0, 0, fmt.Errorf("%s on %s: %w", r.name, name, err)
		}
		res, err := loadgen.Attack(loadgen.Run{Name: name + " " + r.name, BaseURL: c.gws[name].base, Scenario: sc,
			Workers: c.workers, Progress: os.Stderr, Plot: filepath.Join(c.dir, slug(name+" "+r.name)+".html")})
		if err != nil {
			return 0, 0, err
		}
		got[name] = res.Throughput()
	}
	return got["old"], got["new"], nil
}

// holdsFor takes n holds on a new SKU through g, untimed: what the
// confirm and cancel runs act on.
func (c *comparison) holdsFor(g gateway, prog string) ([]loadgen.HoldRef, error) {
	sku := prog + "/ga"
	if err := g.admin.putSKU(sku, int64(c.n), 4); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var refs []loadgen.HoldRef
	_, err := loadgen.Attack(loadgen.Run{Name: "setup holds", BaseURL: g.base, Scenario: loadgen.Holds(sku, prog+"-", c.n),
		Workers: c.workers, Collect: func(code int, body []byte) {
			var h struct {
				HoldID string `json:"hold_id"`
				Buyer  string `json:"buyer"`
			}
			if code == http.StatusCreated && json.Unmarshal(body, &h) == nil {
				mu.Lock()
				refs = append(refs, loadgen.HoldRef{ID: h.HoldID, Buyer: h.Buyer})
				mu.Unlock()
			}
		}})
	if err == nil && uint64(len(refs)) != c.n {
		err = fmt.Errorf("setup took %d holds of %d", len(refs), c.n)
	}
	return refs, err
}

// runs is every run compare can make.
func (c *comparison) runs() []compareRun {
	n := c.n
	return []compareRun{
		{"flash", "flash sale (12 shards, stock n/10)", func(g gateway, prog string) (loadgen.Scenario, error) {
			sku := prog + "/ga"
			return loadgen.Purchases([]string{sku}, prog+"-", n), g.admin.putSKU(sku, int64(n/10), 12)
		}},
		{"steady", "winners committed, 100 SKUs", func(g gateway, prog string) (loadgen.Scenario, error) {
			var skus []string
			for i := range 100 {
				sku := fmt.Sprintf("%s/t%d", prog, i)
				if err := g.admin.putSKU(sku, int64(n), 1); err != nil {
					return nil, err
				}
				skus = append(skus, sku)
			}
			return loadgen.Purchases(skus, prog+"-", n), nil
		}},
		{"storm", "sold-out storm", func(g gateway, prog string) (loadgen.Scenario, error) {
			sku := prog + "/ga"
			return loadgen.Purchases([]string{sku}, prog+"-", n), g.admin.putSKU(sku, 0, 4)
		}},
		{"holds", "holds, one SKU, all granted", func(g gateway, prog string) (loadgen.Scenario, error) {
			sku := prog + "/ga"
			return loadgen.Holds(sku, prog+"-", n), g.admin.putSKU(sku, int64(n), 4)
		}},
		{"confirms", "confirms of n holds", func(g gateway, prog string) (loadgen.Scenario, error) {
			refs, err := c.holdsFor(g, prog)
			return loadgen.Confirms(refs, prog+"-"), err
		}},
		{"cancels", "cancels of n holds", func(g gateway, prog string) (loadgen.Scenario, error) {
			refs, err := c.holdsFor(g, prog)
			return loadgen.Cancels(refs, prog+"-"), err
		}},
		{"carts", "carts of 3 lines, all granted", func(g gateway, prog string) (loadgen.Scenario, error) {
			for _, t := range cartTickets {
				if err := g.admin.putSKU(prog+"/"+t, int64(n), cartShards); err != nil {
					return nil, err
				}
			}
			return loadgen.Carts(prog, cartTickets, prog+"-", n), nil
		}},
	}
}
