package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/e2e/loadgen"
	"github.com/stockgate/stockgate/internal/onsale"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/waitroom"
)

// The waiting room in the suite: once, a line of -queue-joins buyers (the
// joins' throughput and Redis memory per waiting buyer); each round, checks
// of places in that line against the bare gin ceiling of the same answer,
// back to back, with the Redis calls the checks made; once, after the
// rounds, an on-sale of -onsale-tickets to -onsale-buyers through the
// room, checked (package onsale).

// room is the standing line the rounds check.
type room struct {
	program string
	joins   loadgen.Result
	joined  int64
	bytes   int64 // the line's records in Redis
	tickets []string
}

// roomRound is one round's checks.
type roomRound struct {
	polls, bare loadgen.Result
	calls       int64
}

// roomSample is how many places the checks ask about, round-robin.
const roomSample = 256

// standingLine fills a waiting room with n buyers. Its program has one
// ticket and a window of a day: the pacer admits one buyer, then nobody
// (the one admitted is all the ticket allows), so the line stands still
// and every check is of a waiting place.
func (s *suite) standingLine(n uint64) (room, error) {
	rm := room{program: "room" + strconv.FormatInt(time.Now().Unix(), 10)}
	if err := s.gw.admin.putSKU(rm.program+"/ga", 1, 1); err != nil {
		return rm, err
	}
	zero := int64(0)
	if _, err := s.gw.admin.c.PutQueue(s.ctx, rm.program, client.QueueConfig{OpensInSeconds: &zero, RatePerSecond: 1,
		WindowSeconds: 86400, PerRemaining: 1}); err != nil {
		return rm, fmt.Errorf("put queue: %w", err)
	}
	rm.joins = s.attack(fmt.Sprintf("waiting room: %d joins", n), s.gw.base, loadgen.QueueJoins(rm.program, "j", n), 0, s.workers, 0)
	for i := range roomSample {
		st, err := s.gw.admin.c.JoinQueue(s.ctx, rm.program, fmt.Sprintf("s%d", i))
		if err != nil {
			return rm, fmt.Errorf("sample join: %w", err)
		}
		rm.tickets = append(rm.tickets, st.Ticket)
	}
	q, err := s.gw.admin.c.GetQueue(s.ctx, rm.program)
	if err != nil {
		return rm, err
	}
	rm.joined = q.Joined
	k := keys.Queue(keys.MustID(rm.program))
	for _, key := range []string{k.Who(), k.Meta()} {
		v, err := s.rdb.MemoryUsage(s.ctx, key, 0).Result()
		if err != nil {
			return rm, fmt.Errorf("memory usage: %w", err)
		}
		rm.bytes += v
	}
	return rm, nil
}

// roomChecks runs one round's checks of the standing line and of the bare
// ceiling, back to back (which goes first alternates by round).
func (s *suite) roomChecks(r int, rm room) roomRound {
	var out roomRound
	// A check's only Redis call is the line's read (HMGET), at most one per
	// refresh per replica whoever asks. The pacer's steps (their scripts'
	// HMGETs count in commandstats too) go on whether anyone checks or not:
	// the HMGETs of as long a time with no checks, right after, are not
	// the checks'.
	gw := func() {
		before, _ := s.commandStats("hmget")
		out.polls = s.attack("stockgate waiting-room checks", s.gw.base, loadgen.QueuePolls(rm.program, rm.tickets, s.n), 0, s.workers, 0)
		after, _ := s.commandStats("hmget")
		time.Sleep(out.polls.Elapsed)
		idle, _ := s.commandStats("hmget")
		out.calls = max((after-before)-(idle-after), 0)
	}
	bare := func() {
		base, stop, err := serveBare("polls")
		if err != nil {
			fmt.Fprintln(s.log, "bare gin:", err)
			return
		}
		out.bare = s.attack("bare gin waiting-room checks", base, loadgen.QueuePolls(rm.program, rm.tickets, s.n), 0, s.workers, 0)
		stop()
	}
	if r%2 == 0 {
		gw()
		bare()
	} else {
		bare()
		gw()
	}
	return out
}

// roomRounds fills the standing line, then runs each round's checks of
// it into rounds.
func (s *suite) roomRounds(rounds []docInputs) error {
	var err error
	if s.room, err = s.standingLine(s.queueJoins); err != nil {
		return fmt.Errorf("waiting room: %w", err)
	}
	for r := range rounds {
		s.label = fmt.Sprintf(" · r%d", r+1)
		rounds[r].room = s.roomChecks(r, s.room)
	}
	return nil
}

// runRoom is `suite -only room`: the waiting room's measurements alone.
func (s *suite) runRoom() error {
	rounds := make([]docInputs, s.rounds)
	if err := s.roomRounds(rounds); err != nil {
		return err
	}
	var rep onsale.Report
	saleErr := errors.New("not run (-onsale-buyers 0)")
	var pacers []pacerRun
	if s.onsaleBuyers > 0 {
		rep, saleErr = s.onSale()
		pacers = s.pacerRuns()
	}
	pow := s.powRuns()
	s.writeRoom(rounds, s.room, rep, saleErr)
	s.writePacers(pacers)
	s.writePow(pow)
	return nil
}

// pacerRun is one on-sale of the pacers' comparison.
type pacerRun struct {
	abandon, share float64
	rep            onsale.Report
	err            error
}

// The pacers' comparison: a smaller on-sale (a 10 s window, so that the
// older rule's trickle ends within minutes) at three walk-away rates, with
// share 0 (the older rule) and the default 5 %.
const (
	pacerBuyers, pacerTickets = 5000, 500
	pacerWindow               = 10 * time.Second
	pacerStreams              = 200 // the last buyers to join also follow by event stream
)

func (s *suite) pacerRuns() []pacerRun {
	var out []pacerRun
	for _, abandon := range []float64{0.1, 0.3, 0.6} {
		for _, share := range []float64{0, waitroom.DefaultSoldOutShare} {
			fmt.Fprintf(s.log, "on-sale: %d buyers for %d tickets, %.0f %% walking away, sold-out share %v\n",
				pacerBuyers, pacerTickets, 100*abandon, share)
			rep, err := onsale.Run(s.ctx, onsale.Options{BaseURLs: []string{s.gw.base}, Admin: s.gw.admin.c,
				Program: fmt.Sprintf("pacer%d", time.Now().UnixNano()), Buyers: pacerBuyers, Tickets: pacerTickets,
				Abandon: abandon, Rate: 1000, Window: pacerWindow, PerRemaining: 1, SoldOutShare: &share, Workers: int(s.workers), Streams: pacerStreams,
				Refresh: waitroom.Refresh, Seed: 1, Progress: s.log, Timeout: 30 * time.Minute})
			out = append(out, pacerRun{abandon: abandon, share: share, rep: rep, err: err})
		}
	}
	return out
}

// writePacers is the pacers' comparison table.
func (s *suite) writePacers(runs []pacerRun) {
	if len(runs) == 0 {
		return
	}
	d := &s.doc
	fmt.Fprintf(d, "\n**The pacer, conversion-aware against the older rule.** %d buyers for %d tickets, a %v window, the rest as above;\n"+
		"sold-out share 0 is the older rule (no more admitted-but-unused than tickets left), 0.05 the default (admitted past\n"+
		"the tickets left as the line's conversion allows, keeping the buyers expected to meet sold out within 5 %% of the\n"+
		"admitted). Told sold-out: how long after the last sale the waiting buyers, polling as Retry-After says, heard it.\n\n",
		pacerBuyers, pacerTickets, pacerWindow)
	fmt.Fprintf(d, "| walk away | sold-out share | sold out in | admitted | met sold out | share of admitted | told sold-out polling, median / most | on %d streams, median / most |\n|---|---|---|---|---|---|---|---|\n", pacerStreams)
	ms := func(t time.Duration) string { return fmt.Sprintf("%.0f ms", float64(t.Microseconds())/1000) }
	for _, r := range runs {
		if r.err != nil {
			fmt.Fprintf(d, "| %.0f %% | %v | failed: %v | | | | | |\n", 100*r.abandon, r.share, r.err)
			continue
		}
		fmt.Fprintf(d, "| %.0f %% | %v | %v | %d | %d | %.1f %% | %s / %s | %s / %s (%d of %d waiting heard, %d reopened) |\n", 100*r.abandon, r.share,
			r.rep.SaleTime.Round(100*time.Millisecond), r.rep.Admitted, r.rep.Refused, 100*float64(r.rep.Refused)/float64(max(r.rep.Admitted, 1)),
			ms(r.rep.ToldSoldOutP50), ms(r.rep.ToldSoldOutMax), ms(r.rep.StreamToldP50), ms(r.rep.StreamToldMax), r.rep.StreamsHeard, r.rep.StreamsWaiting, r.rep.StreamErrors)
	}
}

// onSale runs the on-sale of the suite's size through the gateway.
func (s *suite) onSale() (onsale.Report, error) {
	fmt.Fprintf(s.log, "on-sale: %d buyers for %d tickets\n", s.onsaleBuyers, s.onsaleTickets)
	return onsale.Run(s.ctx, onsale.Options{BaseURLs: []string{s.gw.base}, Admin: s.gw.admin.c,
		Program: "onsale" + strconv.FormatInt(time.Now().Unix(), 10), Buyers: s.onsaleBuyers, Tickets: s.onsaleTickets,
		Abandon: 0.3, Rate: 1000, Window: time.Minute, PerRemaining: 1, Workers: int(s.workers), Refresh: waitroom.Refresh,
		Seed: 1, Progress: s.log, Timeout: 30 * time.Minute})
}

// writeRoom is the waiting room's section.
func (s *suite) writeRoom(rounds []docInputs, rm room, rep onsale.Report, saleErr error) {
	d := &s.doc
	fmt.Fprintf(d, "\n## Waiting room\n\n"+
		"**A line of %d.** `stockbench suite` joins %d buyers (%d connections, closed loop) to one program's waiting\n"+
		"room that admits one buyer (its one ticket) and then nobody, then checks %d of their places round-robin each\n"+
		"round, back to back with a bare gin handler (in a process of its own, as stockgate) that answers the same route\n"+
		"with a fixed standing of the same JSON shape and a Retry-After header: the ceiling of a check that verifies no\n"+
		"ticket and looks nothing up.\n\n",
		rm.joined, s.queueJoins, s.workers, roomSample)
	fmt.Fprintf(d, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(d, "| joins | %d in %v: %.0f /s, p50 %.1f ms, p99 %.1f ms (%s) |\n", rm.joins.Requests, rm.joins.Elapsed.Round(time.Second),
		rm.joins.Throughput(), msQ(rm.joins, 50), msQ(rm.joins, 99), rm.joins.CodesString())
	fmt.Fprintf(d, "| the line's Redis records (`MEMORY USAGE … SAMPLES 0` of its two keys) | %d bytes: %.1f bytes per waiting buyer |\n",
		rm.bytes, float64(rm.bytes)/float64(max(rm.joined, 1)))
	d.WriteString("\nA check's one Redis call is the line's read (HMGET of its counters), made at most once per refresh (250 ms) per\n" +
		"replica whoever asks; the table counts the HMGETs the cluster served during the checks, less those it served in as\n" +
		"long a time right after with no checks: the pacer's own steps (one script per program every 200 ms, whose HMGETs\n" +
		"Redis counts too) go on whether anyone checks or not. These rounds run after every other measurement, so the\n" +
		"standing line's pacer adds nothing to their counts of Redis calls.\n")
	fmt.Fprintf(d, "\n| round | stockgate checks /s | p99 | bare gin checks /s | p99 | stockgate / bare | line reads from Redis per 1,000 checks |\n|---|---|---|---|---|---|---|\n")
	for i, in := range rounds {
		r := in.room
		fmt.Fprintf(d, "| %d | %.0f | %.1f ms | %.0f | %.1f ms | %.0f %% | %.2f |\n", i+1, r.polls.Throughput(), msQ(r.polls, 99),
			r.bare.Throughput(), msQ(r.bare, 99), 100*ratio(r.polls, r.bare), 1000*float64(r.calls)/float64(max(r.polls.Requests, 1)))
	}
	fmt.Fprintf(d, "\n**An on-sale of %d tickets to %d buyers** (`stockbench run -scenario onsale` does the same against a running\n"+
		"gateway): every buyer joins, polls as Retry-After says, and buys when admitted, or walks away (30 %% of the\n"+
		"admitted); the room admits at most 1,000 a second, with a one-minute window, one admitted-but-unused buyer\n"+
		"per ticket left and the default sold-out share (5 %%: past the tickets left as the line's conversion allows).\n"+
		"The run checks every promise from what the buyers saw (package onsale).\n\n", s.onsaleTickets, s.onsaleBuyers)
	if saleErr != nil {
		fmt.Fprintf(d, "The run failed: %v\n", saleErr)
		return
	}
	ms := func(t time.Duration) string { return fmt.Sprintf("%.1f ms", float64(t.Microseconds())/1000) }
	fmt.Fprintf(d, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(d, "| joins | %d in %v: %.0f /s (p99 %s, client-side: buyers queue for the %d connections) |\n", rep.Buyers,
		rep.JoinTime.Round(time.Millisecond), rep.JoinRate, ms(rep.JoinP99), s.workers)
	fmt.Fprintf(d, "| checks | %d: %.0f /s (p99 %s, client-side) |\n", rep.Polls, rep.PollRate, ms(rep.PollP99))
	fmt.Fprintf(d, "| sold | %d (ledger %d) of %d, in %v from the first admission |\n", rep.Sold, rep.LedgerSold, rep.Tickets, rep.SaleTime.Round(time.Millisecond))
	fmt.Fprintf(d, "| admitted | %d: %d saw it (%d walked away, %d found it sold out); %d came back after the window (to buy, or to check after asking while waiting); %d never saw it (told sold-out first) |\n",
		rep.Admitted, rep.SeenAdmitted, rep.Walked, rep.Refused, rep.Late, rep.Unseen)
	fmt.Fprintf(d, "| admitted ≤ sold + walked away + late + unseen + slack | %d ≤ %d + %d + %d + %d + %d |\n", rep.Admitted, rep.Sold, rep.Walked,
		rep.Late, rep.Unseen, rep.Slack)
	fmt.Fprintf(d, "| waiting buyers told sold-out, after the last sale, polling as told | median %s, most %s |\n", ms(rep.ToldSoldOutP50), ms(rep.ToldSoldOutMax))
	fmt.Fprintf(d, "| every buyer who had not bought, checked once a refresh (%v) after the last sale | %d checked in %v |\n",
		waitroom.Refresh, rep.Swept, rep.SweepTime.Round(time.Millisecond))
	fmt.Fprintf(d, "| errors (retried) | %d |\n", rep.Errors)
	if len(rep.Violations) == 0 {
		d.WriteString("\nNo promise broken: every ticket sold once, admission in position order within the slack, nobody admitted after\nthe sold-out, and every buyer checked a refresh after the last sale was told sold-out.\n")
	} else {
		fmt.Fprintf(d, "\n**%d promises broken:**\n\n- %s\n", len(rep.Violations), strings.Join(rep.Violations, "\n- "))
	}
}

func msQ(r loadgen.Result, q float64) float64 { return float64(r.Quantile(q).Microseconds()) / 1000 }
