package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/stockgate/stockgate/internal/onsale"
	"github.com/stockgate/stockgate/waitroom"
)

// onsaleRun is `stockbench run -scenario onsale`: -n buyers join the
// waiting room of a new program with -tickets tickets, poll as Retry-After
// says, and buy when admitted (or walk away, -abandon of them); the run
// prints what it measured and checks every promise of the waiting room
// (package onsale), exiting 1 if one broke.
func onsaleRun(c runConfig, admin adminClient, stdout, stderr io.Writer) error {
	o := c.onsale
	var share *float64
	if o.soldOutShare >= 0 {
		share = &o.soldOutShare
	}
	rep, err := onsale.Run(context.Background(), onsale.Options{BaseURLs: []string{c.url}, Admin: admin.c, Program: c.program,
		Buyers: int(c.n), Tickets: o.tickets, Abandon: o.abandon, Rate: o.admitRate, Window: o.window, PerRemaining: o.perRemaining,
		SoldOutShare: share, Streams: o.streams, Workers: int(c.workers), Refresh: waitroom.Refresh, Header: c.header, Progress: stderr, Timeout: 30 * time.Minute})
	if err != nil {
		return err
	}
	if c.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			RunID, Program string
			onsale.Report
		}{c.runID, c.program, rep}); err != nil {
			return err
		}
	} else {
		ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
		fmt.Fprintf(stdout, "on-sale of %d tickets to %d buyers (program %s)\n", rep.Tickets, rep.Buyers, c.program)
		fmt.Fprintf(stdout, "  joins      %d in %v: %.0f/s, p99 %s\n", rep.Buyers, rep.JoinTime.Round(time.Millisecond), rep.JoinRate, ms(rep.JoinP99))
		fmt.Fprintf(stdout, "  polls      %d: %.0f/s, p99 %s\n", rep.Polls, rep.PollRate, ms(rep.PollP99))
		fmt.Fprintf(stdout, "  sale       %d sold (ledger %d) in %v from the first admission; %d purchases sent\n",
			rep.Sold, rep.LedgerSold, rep.SaleTime.Round(time.Millisecond), rep.Purchases)
		fmt.Fprintf(stdout, "  admitted   %d: %d saw it (%d walked away, %d found it sold out); %d back after the window; %d never saw it; slack %d\n",
			rep.Admitted, rep.SeenAdmitted, rep.Walked, rep.Refused, rep.Late, rep.Unseen, rep.Slack)
		fmt.Fprintf(stdout, "  sold-out   waiting buyers heard it %s (median) to %s (most) after the last sale, polling as told;\n",
			ms(rep.ToldSoldOutP50), ms(rep.ToldSoldOutMax))
		if o.streams > 0 {
			fmt.Fprintf(stdout, "             %d of %d event streams still waiting heard it %s (median) to %s (most) after it (%d of %d admitted first; %d opened again)\n",
				rep.StreamsHeard, rep.StreamsWaiting, ms(rep.StreamToldP50), ms(rep.StreamToldMax), o.streams-rep.StreamsWaiting, o.streams, rep.StreamErrors)
		}
		fmt.Fprintf(stdout, "             %d checked a refresh after it, in %v: every one told sold-out unless listed below\n",
			rep.Swept, rep.SweepTime.Round(time.Millisecond))
		fmt.Fprintf(stdout, "  errors     %d (retried)\n", rep.Errors)
	}
	if len(rep.Violations) > 0 {
		fmt.Fprintf(stderr, "onsale: %d violations:\n  %s\n", len(rep.Violations), strings.Join(rep.Violations, "\n  "))
		return errors.New("the waiting room broke a promise")
	}
	return nil
}
