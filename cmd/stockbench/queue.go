package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/e2e/loadgen"
)

// queueSample is how many waiting buyers the poll phase checks for.
const queueSample = 256

// queueRun is `stockbench run -scenario queue`: the run's program goes
// behind a waiting room that admits no one (so every buyer keeps
// waiting), -n buyers join it as fast as -workers allow, then -n checks of
// a sample of their tickets are answered; both phases' throughput, and
// the line's length as the gateway counts it.
func queueRun(c runConfig, admin adminClient, stdout, stderr io.Writer) error {
	ctx := context.Background()
	// A window of a day over the run's SKU: as many buyers as it has
	// tickets are admitted, then nobody; the line only grows, as a million
	// buyers before the opening.
	if _, err := admin.c.PutQueue(ctx, c.program, client.QueueConfig{OpensInSeconds: ptr(int64(0)), RatePerSecond: 1,
		WindowSeconds: 86400, PerRemaining: 0.001}); err != nil {
		return fmt.Errorf("put queue: %w", err)
	}
	prefix := "queue-" + c.runID + "-"
	joins, err := loadgen.Attack(loadgen.Run{Name: "queue joins", BaseURL: c.url, Scenario: loadgen.QueueJoins(c.program, prefix, c.n),
		Rate: c.rate, RateEnd: c.rateEnd, Workers: c.workers, Duration: c.duration, Header: c.header, Progress: stderr})
	if err != nil {
		return err
	}
	tickets := make([]string, 0, queueSample)
	for i := range queueSample {
		st, err := admin.c.JoinQueue(ctx, c.program, fmt.Sprintf("%ss%d", prefix, i))
		if err != nil {
			return fmt.Errorf("sample join: %w", err)
		}
		tickets = append(tickets, st.Ticket)
	}
	polls, err := loadgen.Attack(loadgen.Run{Name: "queue polls", BaseURL: c.url, Scenario: loadgen.QueuePolls(c.program, tickets, c.n),
		Workers: c.workers, Duration: c.duration, Header: c.header, Progress: stderr})
	if err != nil {
		return err
	}
	q, err := admin.c.GetQueue(ctx, c.program)
	if err != nil {
		return fmt.Errorf("get queue: %w", err)
	}
	out := struct {
		RunID   string          `json:"run_id"`
		Program string          `json:"program"`
		Joins   loadgen.Summary `json:"joins"`
		Polls   loadgen.Summary `json:"polls"`
		InLine  int64           `json:"in_line"`
		Joined  uint64          `json:"joined_answers"`
		At      time.Time       `json:"at"`
	}{c.runID, c.program, joins.Summary(), polls.Summary(), q.Joined, joins.Count(http.StatusCreated), time.Now().UTC()}
	if c.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprint(stdout, loadgen.Table([]loadgen.Result{joins, polls}))
	fmt.Fprintf(stdout, "\nrun id %s: %d in line (the gateway's count), %d joins answered 201\n", c.runID, q.Joined, out.Joined)
	if uint64(q.Joined) < out.Joined {
		return fmt.Errorf("the line has %d buyers, %d joins were answered 201", q.Joined, out.Joined)
	}
	return nil
}
