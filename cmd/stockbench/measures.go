package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/stockgate/stockgate/e2e/loadgen"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

// What the suite measures beside the load: Redis calls and their time,
// CPU seconds and peak memory of the processes, CPU profiles, the
// ledger's audit of a run, and the machine it ran on.

// redisCalls sums the scripts and data commands the nodes ran (not the
// cluster's own housekeeping: slot-map reloads, replication, INFO).
func (s *suite) redisCalls() int64 {
	calls, _ := s.commandStats(`evalsha|eval|hget|hmget|hset|get|set|decr|incr`)
	return calls
}

// commandStats sums calls and microseconds of the commands named (a regexp
// alternation) over every node, from INFO commandstats.
func (s *suite) commandStats(names string) (calls, usec int64) {
	re := regexp.MustCompile(`cmdstat_(?:` + names + `):calls=(\d+),usec=(\d+)`)
	for _, n := range s.cl.Nodes {
		cl := n.Client()
		info, err := cl.Info(s.ctx, "commandstats").Result()
		cl.Close()
		if err != nil {
			continue
		}
		for _, m := range re.FindAllStringSubmatch(info, -1) {
			c, _ := strconv.ParseInt(m[1], 10, 64)
			u, _ := strconv.ParseInt(m[2], 10, 64)
			calls, usec = calls+c, usec+u
		}
	}
	return calls, usec
}

// cpuSeconds reads the CPU time a pprof -top header reports
// ("Total samples = 2.31s").
func cpuSeconds(top string) float64 {
	m := regexp.MustCompile(`Total samples = ([0-9.]+)(ms|s)\b`).FindStringSubmatch(top)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	if m[2] == "ms" {
		v /= 1000
	}
	return v
}

// rss samples the gateway's resident memory until stop, returning the peak.
func rssPeak(pid int, stop <-chan struct{}) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		var peak int64
		for {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
				sc := bufio.NewScanner(strings.NewReader(string(b)))
				for sc.Scan() {
					if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "VmRSS:" {
						kb, _ := strconv.ParseInt(f[1], 10, 64)
						peak = max(peak, kb)
					}
				}
			}
			select {
			case <-stop:
				out <- peak
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return out
}

// profile takes a CPU profile of the gateway for d and returns pprof's top.
func (s *suite) profile(d time.Duration) <-chan string {
	out := make(chan string, 1)
	go func() {
		file := filepath.Join(s.plots, "cpu.pprof")
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", s.gw.pprof, int(d.Seconds())))
		if err != nil {
			out <- err.Error()
			return
		}
		f, err := os.Create(file)
		if err == nil {
			_, err = io.Copy(f, resp.Body)
			err = errors.Join(err, f.Close())
		}
		resp.Body.Close()
		if err != nil {
			out <- err.Error()
			return
		}
		top, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", filepath.Join(s.plots, "stockgate"), file).CombinedOutput()
		if err != nil {
			out <- fmt.Sprintf("pprof: %v %s", err, top)
			return
		}
		out <- string(top)
	}()
	return out
}

type audit struct {
	sold, total, created int64
}

func (a audit) String() string {
	return fmt.Sprintf("ledger sold+held %d of %d, 201 answers %d, oversold: %v", a.sold, a.total, a.created, a.sold > a.total)
}

func (s *suite) audit(g gateway, skus []string, r loadgen.Result) audit {
	a := audit{created: int64(r.Count(http.StatusCreated))}
	for _, sku := range skus {
		st, err := g.admin.sku(sku)
		if err != nil {
			fmt.Fprintln(s.log, "audit:", err)
			continue
		}
		a.sold, a.total = a.sold+st.Sold+st.Held, a.total+st.Total
	}
	return a
}

// redisMemory measures one shard of the flash sale's SKU and one of its
// deduction records. The flash sale's requests are buyer prefix+"b<i>" with
// key prefix+"<i>" (loadgen.Purchases), and a deduction is keyed by the
// request's gate id, so the probe derives those; which shard a record is
// on depends on its id, so each of the first requests is looked for on
// every shard.
func (s *suite) redisMemory(sku, prefix string) (shard, record int64) {
	parts := strings.SplitN(sku, "/", 2)
	id := stock.MustSKU(parts[0], parts[1])
	shard, _ = s.rdb.MemoryUsage(s.ctx, keys.Shard(id.Program, id.Ticket, 0, 12).Stock()).Result()
	for i := range 200 {
		ask := sale.Ask{Buyer: keys.MustID(prefix + "b" + strconv.Itoa(i)), Key: keys.MustID(prefix + strconv.Itoa(i))}
		gate := sale.PurchaseGateID(ask, id, 1)
		for n := range 12 {
			k := keys.Shard(id.Program, id.Ticket, n, 12)
			if v, err := s.rdb.MemoryUsage(s.ctx, k.Deduction(gate)).Result(); err == nil && v > 0 {
				return shard, v
			}
		}
	}
	return shard, -1
}

// microBenchmarks runs the hot-path Go benchmarks and returns their output.
func microBenchmarks() string {
	out, err := exec.Command("go", "test", "-run", "^$", "-bench", "Micro", "-benchmem", "-benchtime", "200000x",
		"./keys", "./shard", "./cache", "./gateway", "./waitroom").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("go test -bench failed: %v\n%s", err, out)
	}
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "Benchmark") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// hotSKU runs the shard package's hot-SKU measurements: each master's share
// of a sale's scripts for 1 and 12 shards, and probes per purchase through
// a sale's tail.
func hotSKU() string {
	var b strings.Builder
	for _, args := range [][]string{
		{"test", "-run", "^$", "-bench", "HotSKUMasterShare", "-benchtime", "20000x", "./shard"},
		{"test", "-count=1", "-run", "TestProbesPerPurchase", "-v", "./shard"},
	} {
		out, err := exec.Command("go", args...).CombinedOutput()
		fmt.Fprintf(&b, "$ go %s\n", strings.Join(args, " "))
		if err != nil {
			fmt.Fprintf(&b, "failed: %v\n", err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "per master") || strings.Contains(l, "probes per purchase") || strings.HasPrefix(l, "BenchmarkHot") {
				b.WriteString(strings.TrimSpace(l) + "\n")
			}
		}
	}
	return b.String()
}

func goVersion() string { return runtime.Version() }

func runtimeNumCPU() int { return runtime.NumCPU() }
