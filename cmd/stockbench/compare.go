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

	"github.com/stockgate/stockgate/internal/loadgen"
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
	n := fs.Uint64("n", 100_000, "requests of each run")
	workers := fs.Uint64("workers", 64, "concurrent connections of each run")
	rounds := fs.Int("rounds", 3, "rounds of each comparison")
	dir := fs.String("dir", ".run/compare", "working directory (builds, charts)")
	only := fs.String("runs", "flash,storm", "runs to compare: flash, steady, storm, holds, confirms, cancels, carts")
	_ = fs.Parse(args)
	ctx := context.Background()
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	oldSrc := filepath.Join(abs, "old-src")
	_ = exec.Command("git", "worktree", "remove", "--force", oldSrc).Run()
	if out, err := exec.Command("git", "worktree", "add", "--detach", oldSrc, *base).CombinedOutput(); err != nil {
		return fmt.Errorf("git worktree add %s: %v: %s", *base, err, out)
	}
	defer func() { _ = exec.Command("git", "worktree", "remove", "--force", oldSrc).Run() }()
	bins := map[string]string{"old": filepath.Join(abs, "stockgate-old"), "new": filepath.Join(abs, "stockgate-new")}
	build := func(src, out string) error {
		cmd := exec.Command("go", "build", "-o", out, "./cmd/stockgate")
		cmd.Dir = src
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build in %s: %v: %s", src, err, b)
		}
		return nil
	}
	fmt.Fprintf(os.Stderr, "building %s and the working tree\n", *base)
	if err := build(oldSrc, bins["old"]); err != nil {
		return err
	}
	if err := build(".", bins["new"]); err != nil {
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
	gws := map[string]gateway{}
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
		gws[name] = g
	}

	type run struct {
		key, name string
		make      func(g gateway, prog string) (loadgen.Scenario, error)
	}
	// holdsFor takes n holds on a new SKU through g, untimed: what the
	// confirm and cancel runs act on.
	holdsFor := func(g gateway, prog string) ([]loadgen.HoldRef, error) {
		sku := prog + "/ga"
		if err := g.admin.putSKU(sku, int64(*n), 4); err != nil {
			return nil, err
		}
		var mu sync.Mutex
		var refs []loadgen.HoldRef
		_, err := loadgen.Attack(loadgen.Run{Name: "setup holds", BaseURL: g.base, Scenario: loadgen.Holds(sku, prog+"-", *n),
			Workers: *workers, Collect: func(code int, body []byte) {
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
		if err == nil && uint64(len(refs)) != *n {
			err = fmt.Errorf("setup took %d holds of %d", len(refs), *n)
		}
		return refs, err
	}
	all := []run{
		{"flash", "flash sale (12 shards, stock n/10)", func(g gateway, prog string) (loadgen.Scenario, error) {
			sku := prog + "/ga"
			return loadgen.Purchases([]string{sku}, prog+"-", *n), g.admin.putSKU(sku, int64(*n/10), 12)
		}},
		{"steady", "winners committed, 100 SKUs", func(g gateway, prog string) (loadgen.Scenario, error) {
			var skus []string
			for i := range 100 {
				sku := fmt.Sprintf("%s/t%d", prog, i)
				if err := g.admin.putSKU(sku, int64(*n), 1); err != nil {
					return nil, err
				}
				skus = append(skus, sku)
			}
			return loadgen.Purchases(skus, prog+"-", *n), nil
		}},
		{"storm", "sold-out storm", func(g gateway, prog string) (loadgen.Scenario, error) {
			sku := prog + "/ga"
			return loadgen.Purchases([]string{sku}, prog+"-", *n), g.admin.putSKU(sku, 0, 4)
		}},
		{"holds", "holds, one SKU, all granted", func(g gateway, prog string) (loadgen.Scenario, error) {
			sku := prog + "/ga"
			return loadgen.Holds(sku, prog+"-", *n), g.admin.putSKU(sku, int64(*n), 4)
		}},
		{"confirms", "confirms of n holds", func(g gateway, prog string) (loadgen.Scenario, error) {
			refs, err := holdsFor(g, prog)
			return loadgen.Confirms(refs, prog+"-"), err
		}},
		{"cancels", "cancels of n holds", func(g gateway, prog string) (loadgen.Scenario, error) {
			refs, err := holdsFor(g, prog)
			return loadgen.Cancels(refs, prog+"-"), err
		}},
		{"carts", "carts of 3 lines, all granted", func(g gateway, prog string) (loadgen.Scenario, error) {
			for _, t := range cartTickets {
				if err := g.admin.putSKU(prog+"/"+t, int64(*n), cartShards); err != nil {
					return nil, err
				}
			}
			return loadgen.Carts(prog, cartTickets, prog+"-", *n), nil
		}},
	}
	var runs []run
	for _, r := range all {
		if slices.Contains(strings.Split(*only, ","), r.key) {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return fmt.Errorf("-runs %q names no run (flash, steady, storm, holds, confirms, cancels, carts)", *only)
	}
	fmt.Printf("# %s (old) against the working tree (new): %d requests from %d connections per run, %d interleaved rounds\n\n",
		*base, *n, *workers, *rounds)
	fmt.Println("| run | round | old req/s | new req/s | new/old |")
	fmt.Println("|---|---|---|---|---|")
	for _, r := range runs {
		var ratios []float64
		for round := range *rounds {
			order := []string{"old", "new"}
			if round%2 == 1 {
				order = []string{"new", "old"}
			}
			got := map[string]float64{}
			for _, name := range order {
				prog := fmt.Sprintf("cmp%s%d%s", slug(r.name)[:5], round, name)
				prog = strings.ReplaceAll(prog, "-", "")
				sc, err := r.make(gws[name], prog)
				if err != nil {
					return fmt.Errorf("%s on %s: %w", r.name, name, err)
				}
				res, err := loadgen.Attack(loadgen.Run{Name: name + " " + r.name, BaseURL: gws[name].base, Scenario: sc,
					Workers: *workers, Progress: os.Stderr, Plot: filepath.Join(abs, slug(name+" "+r.name)+".html")})
				if err != nil {
					return err
				}
				got[name] = res.Throughput()
			}
			ratio := got["new"] / got["old"]
			ratios = append(ratios, ratio)
			fmt.Printf("| %s | %d | %.0f | %.0f | %.2f |\n", r.name, round+1, got["old"], got["new"], ratio)
		}
		slices.Sort(ratios)
		fmt.Printf("| %s | median (range) | | | **%.2f** (%.2f–%.2f) |\n", r.name, ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
	}
	return nil
}
