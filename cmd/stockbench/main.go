// Command stockbench is stockgate's load tool and benchmark.
//
//	stockbench run -url http://localhost:8080 -scenario flash -n 100000
//	    drives one scenario at a running gateway and prints a summary table
//	    and a ledger audit (flash, steady, reads, soldout, holds).
//	stockbench suite -out docs/BENCHMARKS.md
//	    starts its own Redis Cluster and PostgreSQL, runs stockgate and the
//	    approaches it replaces side by side on this machine, and writes the
//	    benchmark document (what `make bench` runs).
//	stockbench compare -base REV
//	    the flash sale and the sold-out storm through the build at REV and
//	    the working tree side by side, interleaved (`make compare BASE=REV`).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/stockgate/stockgate/internal/loadgen"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = runCmd(os.Args[2:])
	case "suite":
		err = suiteCmd(os.Args[2:])
	case "compare":
		err = compareCmd(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stockbench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: stockbench run [flags] | stockbench suite [flags] | stockbench compare [flags]; -h for flags")
	os.Exit(2)
}

// runCmd drives one scenario at a running gateway.
func runCmd(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	url := fs.String("url", "http://localhost:8080", "gateway base URL")
	scenario := fs.String("scenario", "flash", "flash, steady, reads, soldout or holds")
	n := fs.Uint64("n", 50_000, "requests")
	rate := fs.Int("rate", 0, "open-loop requests per second (0: as fast as -workers allow)")
	workers := fs.Uint64("workers", 64, "concurrent connections")
	program := fs.String("program", fmt.Sprintf("bench%d", time.Now().Unix()), "program id of the SKUs the run creates")
	skus := fs.Int("skus", 100, "SKUs for the steady scenario")
	token := fs.String("admin-token", os.Getenv("STOCKGATE_ADMIN_TOKEN"), "admin bearer token")
	plotFile := fs.String("plot", "", "write a latency-over-time HTML chart here")
	_ = fs.Parse(args)
	admin := adminClient{base: *url, token: *token}
	sku := *program + "/ga"
	var sc loadgen.Scenario
	var stock int64
	var names []string
	switch *scenario {
	case "flash":
		stock = int64(*n / 10)
		names = []string{sku}
		sc = loadgen.Purchases(names, "flash-", *n)
	case "soldout":
		names = []string{sku}
		sc = loadgen.Purchases(names, "storm-", *n)
	case "reads":
		stock, names = 1_000_000, []string{sku}
		sc = loadgen.Reads(sku, *n)
	case "steady":
		stock = int64(*n)
		for i := range *skus {
			names = append(names, fmt.Sprintf("%s/t%d", *program, i))
		}
		sc = loadgen.Purchases(names, "steady-", *n)
	case "holds":
		stock, names = int64(*n), []string{sku}
		sc = loadgen.Holds(sku, "hold-", *n)
	default:
		return fmt.Errorf("unknown scenario %q", *scenario)
	}
	for _, s := range names {
		if err := admin.putSKU(s, stock, 12); err != nil {
			return err
		}
	}
	res, err := loadgen.Attack(loadgen.Run{Name: *scenario, BaseURL: *url, Scenario: sc, Rate: *rate, Workers: *workers,
		Progress: os.Stderr, Plot: *plotFile})
	if err != nil {
		return err
	}
	fmt.Print(loadgen.Table([]loadgen.Result{res}))
	var sold, total int64
	for _, s := range names {
		st, err := admin.sku(s)
		if err != nil {
			return err
		}
		sold, total = sold+st.Sold+st.Held, total+st.Total
	}
	created := int64(res.Count(http.StatusCreated))
	fmt.Printf("\naudit: ledger sold+held %d of %d; 201 answers %d; oversold %v; every 201 in the ledger %v\n",
		sold, total, created, sold > total, *scenario == "reads" || sold >= created)
	if sold > total {
		return errors.New("OVERSOLD")
	}
	return nil
}

type adminClient struct{ base, token string }

type skuState struct {
	Total, Sold, Held int64
}

func (a adminClient) do(method, path, body string) ([]byte, error) {
	req, err := http.NewRequest(method, a.base+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	return b, nil
}

func (a adminClient) putSKU(sku string, total int64, shards int) error {
	return a.putSKUWith(sku, fmt.Sprintf(`{"total":%d,"shards":%d,"max_per_order":4}`, total, shards))
}

func (a adminClient) putSKUWith(sku, body string) error {
	_, err := a.do(http.MethodPut, "/v1/admin/skus/"+sku, body)
	return err
}

func (a adminClient) sku(sku string) (skuState, error) {
	b, err := a.do(http.MethodGet, "/v1/admin/skus/"+sku, "")
	var st skuState
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	return st, err
}

// waitReady polls /readyz until it answers 200.
func waitReady(ctx context.Context, base string) error {
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w", base, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
