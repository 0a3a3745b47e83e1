package main

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stockgate/stockgate/e2e/loadgen"
)

// shardRun is one flash sale of the shards' comparison.
type shardRun struct {
	name    string
	res     loadgen.Result
	unsold  int64 // units left in the ledger at the end
	shards  int   // the SKU's shards at the end
	resizes int64 // the self-sizing gateway's resizes during the run
	err     error
}

// shardSale is the comparison's flash sale: shardRequests purchases of
// one ticket at a SKU with a tenth of them in stock, a longer sale than
// the suite's own flash sale, so that a self-sizing gateway's look each
// second lands mid-sale.
const shardRequests = 300_000

// shardRuns is the shards' comparison, each round: the flash sale on a
// fixed 1 and 12 shards (the suite's gateway) and on a gateway that sizes
// shards itself (STOCKGATE_AUTO_SHARDS=16), starting at 1 and at 12. The
// order rotates by round.
func (s *suite) shardRuns() ([]shardRun, error) {
	auto, err := s.autoGateway()
	if err != nil {
		return nil, err
	}
	defer func() {
		_ = auto.cmd.Process.Kill()
		_ = auto.cmd.Wait()
	}()
	stamp := strconv.FormatInt(time.Now().Unix(), 10)
	type variant struct {
		name   string
		g      gateway
		shards int
	}
	variants := []variant{{"fixed 1 shard", s.gw, 1}, {"fixed 12 shards", s.gw, 12}, {"self-sized from 1", auto, 1}, {"self-sized from 12", auto, 12}}
	var runs []shardRun
	for r := range s.rounds {
		for i := range variants {
			v := variants[(i+r)%len(variants)]
			sku := fmt.Sprintf("shards%sr%d/v%d", stamp, r+1, (i+r)%len(variants))
			run := shardRun{name: v.name}
			if run.err = v.g.admin.putSKU(sku, shardRequests/10, v.shards); run.err != nil {
				return nil, run.err
			}
			before := resizesOf(auto)
			run.res = s.attack("flash sale, "+v.name, v.g.base, loadgen.Purchases([]string{sku}, fmt.Sprintf("sh%sr%d-%d-", stamp, r+1, i), shardRequests), 0, s.workers, 0)
			run.resizes = resizesOf(auto) - before
			st, err := v.g.admin.sku(sku)
			if err != nil {
				return nil, err
			}
			run.unsold, run.shards = st.Total-st.Sold-st.Held, st.Shards
			if st.Sold+st.Held > st.Total || int64(run.res.Count(http.StatusCreated)) > st.Sold+st.Held {
				run.err = fmt.Errorf("audit: sold+held %d of %d, 201s %d", st.Sold+st.Held, st.Total, run.res.Count(http.StatusCreated))
			}
			runs = append(runs, run)
		}
	}
	return runs, nil
}

// autoGateway starts a gateway that sizes shards itself, on the suite's
// Redis and a ledger database of its own.
func (s *suite) autoGateway() (gateway, error) {
	dsn, _, err := s.pg.NewDatabase(s.ctx)
	if err != nil {
		return gateway{}, err
	}
	return startGateway(s.ctx, s.bin, s.redisAddrs, dsn, "STOCKGATE_AUTO_SHARDS=16")
}

// resizesOf reads the gateway's count of self-sizing resizes.
func resizesOf(g gateway) int64 {
	return int64(metric(g.base, `stockgate_reseeds_total{reason="resize"}`))
}

// runShards is `suite -only shards`.
func (s *suite) runShards() error {
	runs, err := s.shardRuns()
	if err != nil {
		return err
	}
	s.writeShards(runs)
	return nil
}

func (s *suite) writeShards(runs []shardRun) {
	d := &s.doc
	fmt.Fprintf(d, "\n## Self-sized shards against fixed ones\n\n"+
		"A flash sale of %d purchases of one ticket, %d in stock, from %d connections as fast as they are answered: on\n"+
		"1 and on 12 fixed shards (the suite's gateway), and on a gateway with `STOCKGATE_AUTO_SHARDS=16` starting at 1\n"+
		"and at 12 shards; the order rotates by round. \"Last 201 after the first 409\" is the false sold-out window\n"+
		"(buyers told sold out while others still bought); \"unsold\" is units the ledger still had when the run ended\n"+
		"(stranded on shards the buyers' probes missed).\n\n"+
		"| run | req/s | p99 | 503 | last 201 after the first 409 | unsold | shards at the end | resizes |\n|---|---|---|---|---|---|---|---|\n",
		shardRequests, shardRequests/10, s.workers)
	for _, r := range runs {
		if r.err != nil {
			fmt.Fprintf(d, "| %s | failed: %v | | | | | | |\n", r.name, r.err)
			continue
		}
		resizes := "–"
		if strings.HasPrefix(r.name, "self") {
			resizes = strconv.FormatInt(r.resizes, 10)
		}
		fmt.Fprintf(d, "| %s | %.0f | %v | %d | %v | %d | %d | %s |\n", r.name, r.res.Throughput(), r.res.Quantile(99),
			r.res.Count(http.StatusServiceUnavailable), r.res.SoldOutWindow().Round(time.Millisecond), r.unsold, r.shards, resizes)
	}
}
