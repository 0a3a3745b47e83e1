package model_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
	"github.com/stockgate/stockgate/waitroom"
)

// The model's waiting room: a second program whose two tickets (4 units
// each, restocked while sold out) sell only through its queue, open at
// once, with a window of qWindow, at most one admitted buyer who has not
// bought per ticket left, and a rate that never holds anyone back; every
// replica runs the pacer (one paces at a time). Its buyers (qbuyer0 …) join
// and join again (presenting one of their tickets, another buyer's, a
// forged one, or none), check their places on any replica, and buy, hold,
// or buy or hold carts with their admission token (of any of their places),
// with none, another buyer's or a forged one, and with their own before
// their place is admitted; they send one take to two replicas at once, or
// two takes at once; they retry (with the token of another of their places
// too), reuse keys, and walk away (their admissions lapse). Their holds,
// orders and carts are the model's: confirmed, cancelled, refunded and
// expired by its other operations, which need no admission.
//
// Two things only Redis knows are read around each request, as oracles:
// when a place's position was admitted (the batch the admission's window
// runs from; none: not admitted, or the line lost) and which request holds
// a buyer's spent admission (its gate id, learned when it first appears).
// From them the model predicts every answer exactly, up to the moment in
// the request at which the gateway read them. It checks: the problem of
// every refusal (admission-required, admission-invalid, admission-used,
// admission-expired, sold-out, quantity-over-limit, a reused key) and that
// it moved nothing (the ledger check after each step); no take without a
// valid admission spent on it and one committed take per admission, also
// for takes at once (until a FLUSHALL, which forgets spent admissions: a
// known limit); the admission given back by a refusal that moved nothing
// and kept by one that took or replayed; each buyer's one place (201 once,
// 200 with the same place and ticket again, on any replica; kept across a
// FLUSHALL by presenting a ticket; a new one after it beyond every position
// ever given when none is presented); every check's position and ticket,
// its token (the buyer's own), and its state: never admitted where Redis
// has no admission, never expired before the window passed, never waiting
// behind a position known admitted one refresh earlier (admissions a prefix
// of the line, from the "ahead" count), sold-out only when the ledger is
// (or was a moment ago) and always one refresh after it; the admin view's
// serving counter a prefix of the positions Redis says admitted; no
// admission while sold out; the ledger's sold, held and each buyer's units
// of the tickets; and at the end, that the line moves while stock is left.

// qBuyers is how many buyers use the waiting room: more than join in a
// run, so new ones come all along.
const qBuyers = 40

// qWindow is the waiting room's admission window.
const qWindow = 4 * time.Second

// qFresh is how long after a change of the line or the ledger every
// replica's answer to a check reflects it: one refresh of its memory, and
// a little for the clocks' granularity.
const qFresh = waitroom.Refresh + qSkew

// qSkew is the clocks' granularity: a change made this long before a
// replica began to read the line (its answer's as_of) is in the answer.
const qSkew = 20 * time.Millisecond

// qStaleMost bounds how old a replica's reading of the line may be when
// it answers (as_of): older than qFresh only while a reload is slow, and a
// reload gives up after 5 s.
const qStaleMost = 10 * time.Second

type mQueue struct {
	program keys.ID
	skus    []*mSKU
	secret  []byte
	buyers  []*mQBuyer
	places  map[int64]*mPlace // every position handed out
	all     []*mPlace         // the same, in the order they were given
	maxPos  int64
	done    []*mQDone         // committed takes, for retries and reused keys
	gates   map[string]string // a request → the gate id its claim carries in Redis
	// marks are positions known admitted (so every one before them is) and
	// when, since the last FLUSHALL; ledgerMarks the serving counters the
	// ledger had recorded, and when.
	marks, ledgerMarks []qMark
	flushedAt          time.Time
	soldOutSince       time.Time     // zero while the ledger has something left or held
	reopened           time.Time     // when it last stopped being sold out
	took               time.Duration // spent in the waiting room's operations and checks
	checks             int
	// answered is when each replica last answered a join or check of the
	// line: a replica's memory of the line was made at or before it.
	answered map[*systest.Env]time.Time
}

type qMark struct {
	pos int64
	at  time.Time
}

type mQBuyer struct {
	name   string
	place  *mPlace   // the place Redis has for it; nil: none (not joined, or lost)
	places []*mPlace // every place it was given
	// claim is the gate id of the request Redis says spent its admission
	// ("" none); claimReq that request.
	claim, claimReq string
	bought          int // takes committed on its admission since the last FLUSHALL
}

type mPlace struct {
	buyer  *mQBuyer
	ticket string
	pos    int64
	token  string    // its admission token, as a check answers it once admitted
	first  time.Time // the earliest admission time Redis had for it (zero: none seen)
}

// mQDone is a committed take of the queued program and what it was sent
// with.
type mQDone struct {
	t     mTake
	body  string
	id    string
	token string
	place *mPlace
}

// qStatus is a join's or a check's answer.
type qStatus struct {
	Buyer     string    `json:"buyer"`
	Ticket    string    `json:"ticket"`
	State     string    `json:"state"`
	Position  int64     `json:"position"`
	Ahead     *int64    `json:"ahead"`
	Admission string    `json:"admission_token"`
	AsOf      time.Time `json:"as_of"`
}

// newQueue puts the queued program: its tickets and its waiting room.
func (m *sim) newQueue(e *systest.Env) {
	m.t.Helper()
	q := &mQueue{program: keys.MustID(testenv.ID(m.t, "mq")), places: map[int64]*mPlace{}, gates: map[string]string{},
		answered: map[*systest.Env]time.Time{}}
	m.q = q
	m.placeOnSecond(q.program)
	for i := range 2 {
		s := &mSKU{sku: stock.SKU{Program: q.program, Ticket: keys.MustID(fmt.Sprintf("q%d", i))}, total: 4, shards: 1 + i}
		m.put(e, s)
		q.skus = append(q.skus, s)
	}
	// A program cap no buyer reaches (every ticket is 4): the ledger counts
	// each buyer's units of the program, which checkQueueBuyers reads.
	if r := e.Do(m.t, http.MethodPut, "/v1/admin/programs/"+q.program.String(), nil, `{"per_buyer":1000}`); r.Status != http.StatusOK {
		m.fail("PUT program = %d %s", r.Status, r.Body)
	}
	r := e.Do(m.t, http.MethodPut, "/v1/admin/programs/"+q.program.String()+"/queue", nil,
		fmt.Sprintf(`{"opens_in_seconds":0,"rate_per_second":100,"window_seconds":%d,"per_remaining":1}`, int(qWindow/time.Second)))
	if r.Status != http.StatusOK {
		m.fail("PUT queue = %d %s", r.Status, r.Body)
	}
	c, err := e.Ledger.Queue(context.Background(), q.program)
	if err != nil {
		m.fail("ledger queue: %v", err)
	}
	if q.secret, err = hex.DecodeString(c.Secret); err != nil {
		m.fail("queue secret %q: %v", c.Secret, err)
	}
	for i := range qBuyers {
		q.buyers = append(q.buyers, &mQBuyer{name: fmt.Sprintf("qbuyer%d", i)})
	}
}

// ledgerStocks are the SKUs whose ledger rows the model checks: stocks and
// the queued program's tickets.
func (m *sim) ledgerStocks() []*mSKU { return append(m.stocks(), m.q.skus...) }

// queueOp runs one random operation on the waiting room.
func (m *sim) queueOp() {
	defer m.queueTimed(time.Now())
	switch r := m.rng.IntN(100); {
	case r < 22:
		m.queueJoin()
	case r < 40:
		m.queueCheck()
	case r < 78:
		m.queueTake()
	case r < 86:
		m.queueRetry()
	case r < 88:
		m.queueReuse()
	case r < 91:
		m.queueTwice()
	case r < 97:
		m.queueSettle()
	default:
		m.queueRestock()
	}
}

// queueSummary says how the waiting room's part went.
func (m *sim) queueSummary() string {
	var ss []string
	for _, s := range m.q.skus {
		ss = append(ss, fmt.Sprintf("%s: %d sold, %d held of %d", s.ticket(), s.sold, s.held, s.total))
	}
	return fmt.Sprintf("%d places given; %s; took %v", m.q.maxPos, strings.Join(ss, ", "), m.q.took.Round(time.Millisecond))
}

// queueTimed adds the time since start to the queue part's.
func (m *sim) queueTimed(start time.Time) { m.q.took += time.Since(start) }

func (m *sim) qBuyer(name string) *mQBuyer {
	for _, b := range m.q.buyers {
		if b.name == name {
			return b
		}
	}
	m.fail("no queue buyer %s", name)
	return nil
}

// qPlaceOf makes the place a ticket names, checking it is buyer's.
func (m *sim) qPlaceOf(b *mQBuyer, ticket string) *mPlace {
	who, place, err := waitroom.ParseTicket(m.q.secret, m.q.program, ticket)
	if err != nil || who.String() != b.name || place.Early {
		m.fail("ticket %q of %s: %v (%s, early %v)", ticket, b.name, err, who, place.Early)
	}
	pos := waitroom.Position(m.q.secret, place, 0)
	return &mPlace{buyer: b, ticket: ticket, pos: pos, token: waitroom.Admission(m.q.secret, m.q.program, who, pos, place.At)}
}

// queueJoin joins the line as a random buyer: as it is, presenting one of
// its tickets, or (refused) another buyer's or a forged one.
func (m *sim) queueJoin() {
	q := m.q
	b := q.buyers[m.rng.IntN(len(q.buyers))]
	var with *mPlace
	ticket, bad := "", false
	switch r := m.rng.IntN(20); {
	case r < 7 && len(b.places) > 0:
		with = b.places[m.rng.IntN(len(b.places))]
		ticket = with.ticket
	case r == 7:
		o := q.buyers[m.rng.IntN(len(q.buyers))]
		if o == b || len(o.places) == 0 {
			return
		}
		ticket, bad = o.places[0].ticket, true
	case r == 8 && len(b.places) > 0:
		ticket, bad = forge(b.places[0].ticket), true
	}
	body := fmt.Sprintf(`{"buyer":%q}`, b.name)
	if ticket != "" {
		body = fmt.Sprintf(`{"buyer":%q,"ticket":%q}`, b.name, ticket)
	}
	op := map[bool]string{false: "queue-join", true: "queue-join-ticket"}[with != nil]
	if bad {
		op = "queue-join-bad-ticket"
	}
	m.ops[op]++
	path := "/v1/programs/" + q.program.String() + "/queue"
	e := m.env()
	start := time.Now()
	for retried := false; ; retried = true {
		ts, prev := time.Now(), q.answered[e]
		r := e.Do(m.t, http.MethodPost, path, nil, body)
		tr := time.Now()
		if !bad {
			q.answered[e] = tr
		}
		m.tracef("POST %s %s on %d = %d %s", path, body, slices.Index(m.envs, e), r.Status, r.Body)
		if r.Status == http.StatusServiceUnavailable && time.Since(start) < falseSoldOutBound {
			m.ops["queue-join-busy"]++
			time.Sleep(20 * time.Millisecond) // poll interval
			continue
		}
		if bad {
			if r.Status != http.StatusBadRequest || systest.ProblemKind(r) != "invalid-queue-ticket" {
				m.fail("join of %s with ticket %q = %d %s, want 400 invalid-queue-ticket", b.name, ticket, r.Status, r.Body)
			}
			return
		}
		var st qStatus
		_ = json.Unmarshal(r.Body, &st)
		var p *mPlace
		switch {
		case b.place != nil, with != nil:
			// Its place as Redis has it, or as the ticket says.
			p = b.place
			if p == nil {
				p = with
			}
			if r.Status != http.StatusOK {
				m.fail("join of %s (place %d, ticket %v) = %d %s, want 200 with its place", b.name, p.pos, with != nil, r.Status, r.Body)
			}
		default:
			// A new place, after every one ever given (a join that was
			// answered 503 may have taken it: then 200).
			if r.Status != http.StatusCreated && (!retried || r.Status != http.StatusOK) || st.Ticket == "" {
				m.fail("join of %s (no place) = %d %s, want 201", b.name, r.Status, r.Body)
			}
			p = m.qPlaceOf(b, st.Ticket)
			if p.pos <= q.maxPos || q.places[p.pos] != nil {
				m.fail("join of %s = %s: position %d given before (the highest given is %d, to %s)", b.name, r.Body, p.pos, q.maxPos, fmt.Sprint(q.places[p.pos]))
			}
			q.maxPos, q.places[p.pos] = p.pos, p
			q.all = append(q.all, p)
			b.places = append(b.places, p)
			m.ops["queue-join-new"]++
		}
		b.place = p
		m.qJudgeStatus(p, r, ts, tr, prev)
		return
	}
}

// forge alters a signed ticket or token's signature.
func forge(s string) string {
	if strings.HasSuffix(s, "AAA") {
		return s[:len(s)-3] + "BBB"
	}
	return s[:len(s)-3] + "AAA"
}

// queueCheck checks one of a random buyer's places (or, refused, a forged
// ticket) on any replica.
func (m *sim) queueCheck() {
	b := m.q.buyers[m.rng.IntN(len(m.q.buyers))]
	if len(b.places) == 0 {
		return
	}
	p := b.places[m.rng.IntN(len(b.places))]
	e := m.env()
	if m.rng.IntN(20) == 0 {
		m.ops["queue-check-forged"]++
		r := e.Do(m.t, http.MethodGet, "/v1/programs/"+m.q.program.String()+"/queue/"+forge(p.ticket), nil, "")
		if r.Status != http.StatusBadRequest || systest.ProblemKind(r) != "invalid-queue-ticket" {
			m.fail("check of a forged ticket = %d %s, want 400 invalid-queue-ticket", r.Status, r.Body)
		}
		return
	}
	m.ops["queue-check"]++
	m.qCheckOn(e, p)
}

// qCheckOn checks p on e and judges the answer.
func (m *sim) qCheckOn(e *systest.Env, p *mPlace) {
	path := "/v1/programs/" + m.q.program.String() + "/queue/" + p.ticket
	start := time.Now()
	for {
		ts, prev := time.Now(), m.q.answered[e]
		r := e.Do(m.t, http.MethodGet, path, nil, "")
		tr := time.Now()
		m.q.answered[e] = tr
		m.tracef("GET %s (%s at %d) on %d = %d %s", path, p.buyer.name, p.pos, slices.Index(m.envs, e), r.Status, r.Body)
		if r.Status == http.StatusServiceUnavailable && time.Since(start) < falseSoldOutBound {
			m.ops["queue-check-busy"]++
			time.Sleep(20 * time.Millisecond) // poll interval
			continue
		}
		if r.Status != http.StatusOK {
			m.fail("check of %s at %d = %d %s", p.buyer.name, p.pos, r.Status, r.Body)
		}
		m.qJudgeStatus(p, r, ts, tr, prev)
		return
	}
}

// qAdm is what Redis says of a position's admission.
type qAdm struct {
	lost bool  // the line has no record (lost, not restored yet)
	ok   bool  // admitted
	at   int64 // when its batch was admitted, Unix ms: its window runs from then
}

// qAdmissions reads what Redis says of the line's admissions: whether it
// has a record of the line, and each batch's end position and time.
func (m *sim) qAdmissions() qBatches {
	ctx := context.Background()
	k := keys.Queue(m.q.program)
	bs := qBatches{lost: m.qLost(), read: time.Now()}
	v, err := m.envs[0].Redis.ZRangeWithScores(ctx, k.BatchesByEnd(), 0, -1).Result()
	if err != nil {
		m.fail("queue batches: %v", err)
	}
	for _, z := range v {
		member, _ := z.Member.(string)
		_, at, _ := strings.Cut(member, ":")
		ms, err := strconv.ParseInt(at, 10, 64)
		if err != nil {
			m.fail("queue batch %q", member)
		}
		bs.ends = append(bs.ends, int64(z.Score))
		bs.ats = append(bs.ats, ms)
	}
	bs.read = time.Now()
	return bs
}

// qBatches are the line's admissions as Redis had them at read.
type qBatches struct {
	lost      bool
	ends, ats []int64 // by end position
	read      time.Time
}

// of is what the batches say of p's position (the first batch ending at
// or past it admitted it, as a spend reads them), noted in the model.
func (m *sim) qOf(bs qBatches, p *mPlace) qAdm {
	a := qAdm{lost: bs.lost}
	i, _ := slices.BinarySearch(bs.ends, p.pos)
	if i == len(bs.ends) {
		return a
	}
	a.ok, a.at = true, bs.ats[i]
	if t := time.UnixMilli(a.at); p.first.IsZero() || t.Before(p.first) {
		p.first = t
	}
	// Kept only when past every earlier mark: the marks rise in position
	// and time.
	if n := len(m.q.marks); n == 0 || m.q.marks[n-1].pos < p.pos {
		m.q.marks = append(m.q.marks, qMark{pos: p.pos, at: bs.read})
	}
	return a
}

// qAdmissionOf reads from Redis whether p's position is admitted and when
// (the batch a spend measures the window from), and notes it.
func (m *sim) qAdmissionOf(p *mPlace) qAdm { return m.qOf(m.qAdmissions(), p) }

// qLost says Redis has no record of the line.
func (m *sim) qLost() bool {
	err := m.envs[0].Redis.HGet(context.Background(), keys.Queue(m.q.program).Meta(), "line").Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		m.fail("queue meta: %v", err)
	}
	return err != nil
}

// qKnown is the highest position known admitted at least qSkew before
// asOf (since the last FLUSHALL) in Redis (in the ledger's record:
// ledger): every replica's answer read from the line at asOf has its
// serving counter at or past it (one answered from the ledger's facts,
// while Redis is slow or lost, the ledger's).
func (m *sim) qKnown(asOf time.Time, ledger bool) int64 {
	marks := m.q.marks
	if ledger {
		marks = m.q.ledgerMarks
	}
	var n int64
	for _, k := range marks {
		if !asOf.Before(k.at.Add(qSkew)) {
			n = max(n, k.pos)
		}
	}
	return n
}

// qJudgeStatus checks a join's or a check's answer about p, sent at ts and
// answered at tr by a replica that last answered one at prev.
func (m *sim) qJudgeStatus(p *mPlace, r systest.Reply, ts, tr, prev time.Time) {
	q := m.q
	var st qStatus
	if err := json.Unmarshal(r.Body, &st); err != nil || st.Ticket != p.ticket || st.Position != p.pos || st.Buyer != p.buyer.name {
		m.fail("queue status of %s at %d = %d %s: want its ticket and position", p.buyer.name, p.pos, r.Status, r.Body)
	}
	a := m.qAdmissionOf(p)
	after := time.Now()
	// The answer is the line as the replica read it at as_of: every change
	// before then is in it. A replica reads again every Refresh; an older
	// reading is answered only while a reload is slow: at once to a line
	// checked steadily (the replica answered one within LineIdle: its
	// memory was made by then), else after waiting LineIdleWait for the
	// reload.
	asOf := st.AsOf
	if asOf.IsZero() || asOf.After(tr.Add(qSkew)) || asOf.Before(ts.Add(-qStaleMost)) {
		m.fail("queue status of %s at %d = %s: as_of %v, sent %v, answered %v", p.buyer.name, p.pos, r.Body,
			asOf.Format("15:04:05.000"), ts.Format("15:04:05.000"), tr.Format("15:04:05.000"))
	}
	if asOf.Before(ts.Add(-qFresh)) {
		steady := !prev.IsZero() && ts.Sub(prev) <= waitroom.LineIdle
		if waited := tr.Sub(ts) >= waitroom.LineIdleWait; !steady && !waited {
			m.fail("queue status of %s at %d = %s: a reading %v old, sent %v after this replica's last answer and answered in %v (a line not checked steadily waits %v for its reload)",
				p.buyer.name, p.pos, r.Body, ts.Sub(asOf), ts.Sub(prev), tr.Sub(ts), waitroom.LineIdleWait)
		}
		m.ops["queue-status-stale"]++
	}
	// An answer from a memory of the line older than the FLUSHALL.
	beforeFlush := !q.flushedAt.IsZero() && asOf.Before(q.flushedAt.Add(qSkew))
	mustSoldOut := !q.soldOutSince.IsZero() && !asOf.Before(q.soldOutSince.Add(qSkew))
	maySoldOut := !q.soldOutSince.IsZero() || !q.reopened.IsZero() && asOf.Before(q.reopened.Add(falseSoldOutBound))
	ok := st.State == waitroom.SoldOut || !mustSoldOut
	switch st.State {
	case waitroom.SoldOut:
		ok = maySoldOut
	case waitroom.Admitted:
		ok = ok && st.Admission == p.token && (a.ok || a.lost || beforeFlush)
	case waitroom.Expired:
		ok = ok && (a.ok && time.UnixMilli(a.at).Add(qWindow).Before(after) ||
			!p.first.IsZero() && p.first.Add(qWindow).Before(tr) || beforeFlush)
	case waitroom.Waiting:
		ok = ok && r.Header.Get("Retry-After") != "" && st.Ahead != nil && *st.Ahead >= 0
		// The replica's serving counter, from the places it says are
		// ahead.
		if serving := p.pos - *st.Ahead - 1; ok && serving < m.qKnown(asOf, false) {
			ok = serving >= m.qKnown(asOf, true)
			m.ops["queue-status-waiting-as-recorded"]++
		}
	default:
		ok = false
	}
	if !ok {
		m.fail("queue status of %s at %d = %s (sent %s, %v after the window of its batch at %v; Redis: %+v; known admitted %d, recorded %d; sold out since %v, reopened %v; flushed %v)",
			p.buyer.name, p.pos, r.Body, ts.Format("15:04:05.000"), ts.Sub(time.UnixMilli(a.at).Add(qWindow)), time.UnixMilli(a.at).Format("15:04:05.000"), a,
			m.qKnown(asOf, false), m.qKnown(asOf, true), q.soldOutSince.Format("15:04:05.000"), q.reopened.Format("15:04:05.000"), q.flushedAt.Format("15:04:05.000"))
	}
	m.ops["queue-status-"+st.State]++
}

// Tokens a take of the queued program is sent with.
const (
	qOwn    = iota // the buyer's own (of one of its places)
	qNone          // no Admission-Token
	qOther         // another buyer's
	qForged        // the buyer's, its signature altered
)

// qToken picks the token a take of b is sent with, and the place of an
// own one.
func (m *sim) qToken(b *mQBuyer) (kind int, token string, p *mPlace) {
	r := m.rng.IntN(100)
	switch {
	case r < 80 && len(b.places) > 0:
		p = b.place
		if p == nil || m.rng.IntN(4) == 0 {
			p = b.places[m.rng.IntN(len(b.places))]
		}
		return qOwn, p.token, p
	case r < 88:
		return qNone, "", nil
	case r < 94:
		for _, i := range m.rng.Perm(len(m.q.buyers)) {
			if o := m.q.buyers[i]; o != b && len(o.places) > 0 {
				return qOther, o.places[0].token, nil
			}
		}
		return qNone, "", nil
	default:
		if len(b.places) == 0 {
			return qNone, "", nil
		}
		return qForged, forge(b.places[0].token), nil
	}
}

// qReady is a buyer whose admission is not spent and whose place was
// admitted a while before the window ends, or nil.
func (m *sim) qReady() *mQBuyer {
	var ready []*mQBuyer
	bs := m.qAdmissions()
	for _, b := range m.q.buyers {
		if b.claim != "" || b.place == nil {
			continue
		}
		if a := m.qOf(bs, b.place); a.ok && time.Now().Add(time.Second).Before(time.UnixMilli(a.at).Add(qWindow)) {
			ready = append(ready, b)
		}
	}
	if len(ready) == 0 {
		return nil
	}
	return ready[m.rng.IntN(len(ready))]
}

// queueTake buys or holds one of the queued tickets (1 or 2 units, or 5:
// over the most per order), or buys or holds a cart of them: mostly as a
// buyer admitted and free to buy, with its token (having checked its
// place, or not), else as a random buyer with any token.
func (m *sim) queueTake() {
	q := m.q
	b := q.buyers[m.rng.IntN(len(q.buyers))]
	e := m.env()
	kind, token, p := m.qToken(b)
	if r := m.qReady(); r != nil && m.rng.IntN(3) > 0 {
		b, kind, token, p = r, qOwn, r.place.token, r.place
		if m.rng.IntN(2) == 0 {
			m.ops["queue-check"]++
			m.qCheckOn(e, p)
		}
	}
	t, op := m.qNewTake(b, true)
	m.ops[op]++
	m.qSend(e, t, m.body(t), kind, token, p)
}

// qNewTake is a new take of b: a purchase or a hold of one ticket (1 or 2
// units, or if overMax, one time in ten 5: over the most per order), or a
// cart of them, bought or held; op names it.
func (m *sim) qNewTake(b *mQBuyer, overMax bool) (t mTake, op string) {
	q := m.q
	t = mTake{key: m.newKey(), buyer: b.name}
	s := q.skus[m.rng.IntN(len(q.skus))]
	n := int64(1 + m.rng.IntN(2))
	if overMax && m.rng.IntN(10) == 0 {
		n = 5
	}
	switch r := m.rng.IntN(10); {
	case r < 4:
		t.path, t.lines, op = systest.SKUPath(s.sku)+"/purchases", []mLine{{s, n}}, "queue-purchase"
	case r < 6:
		t.path, t.lines, t.hold, t.ttl, op = systest.SKUPath(s.sku)+"/holds", []mLine{{s, n}}, true, m.holdTTL(), "queue-hold"
	default:
		t.cart, t.path, op = true, "/v1/programs/"+q.program.String()+"/carts", "queue-cart"
		if r == 9 {
			t.hold, t.ttl, t.path, op = true, m.holdTTL(), "/v1/programs/"+q.program.String()+"/cart-holds", "queue-cart-hold"
		}
		for _, i := range m.rng.Perm(len(q.skus))[:1+m.rng.IntN(len(q.skus))] {
			t.lines = append(t.lines, mLine{q.skus[i], int64(1 + m.rng.IntN(2))})
		}
	}
	return t, op
}

// queueTwice sends, as a buyer admitted and free to buy, one take to two
// replicas at once (one commits it, the other replays it, or both are
// refused), or two takes at once (at most one commits: the admission is
// spent once; the other is refused admission-used, or as it would be
// alone). An answer 503 is sent again with its key.
func (m *sim) queueTwice() {
	b := m.qReady()
	if b == nil {
		return
	}
	p := b.place
	same := m.rng.IntN(2) == 0
	ts := make([]mTake, 2)
	ts[0], _ = m.qNewTake(b, false)
	ts[1] = ts[0]
	if !same {
		ts[1], _ = m.qNewTake(b, false)
	}
	m.ops[map[bool]string{true: "queue-twice-same", false: "queue-twice"}[same]]++
	i := m.rng.IntN(len(m.envs))
	es := []*systest.Env{m.envs[i], m.envs[(i+1+m.rng.IntN(len(m.envs)-1))%len(m.envs)]}
	bodies := []string{m.body(ts[0]), m.body(ts[1])}
	a1 := m.qAdmissionOf(p)
	sent := time.Now()
	rs := make([]systest.Reply, 2)
	var wg sync.WaitGroup
	for k := range 2 {
		wg.Go(func() { rs[k] = m.qPost(es[k], ts[k].path, ts[k].key, p.token, bodies[k]) })
	}
	wg.Wait()
	busy := make([]bool, 2)
	for k := range 2 {
		for start := time.Now(); rs[k].Status == http.StatusServiceUnavailable; busy[k] = true {
			if time.Since(start) > falseSoldOutBound {
				m.fail("take %d of %s key %s still 503 after %v: %s", k, bodies[k], ts[k].key, time.Since(start), rs[k].Body)
			}
			m.ops["queue-twice-busy"]++
			time.Sleep(20 * time.Millisecond) // poll interval
			rs[k] = m.qPost(es[k], ts[k].path, ts[k].key, p.token, bodies[k])
		}
	}
	answered := time.Now()
	a2 := m.qAdmissionOf(p)
	outs := []string{qOutcome(rs[0]), qOutcome(rs[1])}
	for k := range 2 {
		if busy[k] && outs[k] == "replay" && !(same && outs[1-k] == "new") {
			outs[k] = "new" // committed by an attempt answered 503
		}
	}
	var fresh []int
	for k := range 2 {
		w := m.qWant(ts[k], qOwn, "", "", a1, a2, sent, answered)
		switch {
		case w.allows(rs[k], ts[k].cart) && outs[k] != "replay":
		case same && outs[k] == "replay" && w.outcomes["new"]:
		case !same && outs[k] == "409 admission-used":
		case !w.allows(rs[k], ts[k].cart) && outs[k] == "new" && m.settleExpiries(answered) &&
			m.qWant(ts[k], qOwn, "", "", a1, a2, sent, answered).allows(rs[k], ts[k].cart):
		default:
			m.fail("%s's takes at once %s key %s and %s key %s = %s %s / %s %s; admitted before %+v after %+v",
				b.name, bodies[0], ts[0].key, bodies[1], ts[1].key, outs[0], rs[0].Body, outs[1], rs[1].Body, a1, a2)
		}
		if outs[k] == "new" {
			fresh = append(fresh, k)
		}
	}
	for k := range 2 {
		m.ops["queue-twice-"+outs[k]]++
	}
	switch {
	case len(fresh) > 1:
		m.fail("%s sold twice on one admission, at once: %s key %s = %s / %s key %s = %s", b.name, bodies[0], ts[0].key, rs[0].Body, bodies[1], ts[1].key, rs[1].Body)
	case same && len(fresh) == 0 && (outs[0] == "replay" || outs[1] == "replay"):
		m.fail("one take sent twice at once replayed and never made: %s / %s", rs[0].Body, rs[1].Body)
	case same && len(fresh) == 1 && outs[1-fresh[0]] == "replay" && systest.ReplyID(rs[0]) != systest.ReplyID(rs[1]):
		m.fail("one take sent twice at once made two: %s / %s", rs[0].Body, rs[1].Body)
	case same && len(fresh) == 1 && outs[1-fresh[0]] != "replay":
		m.fail("one take sent twice at once: %s and %s", rs[fresh[0]].Body, rs[1-fresh[0]].Body)
	}
	// Redis holds the admission for the take that committed, for none if
	// none did.
	c := m.qClaim(b)
	if len(fresh) == 0 {
		if c != "" {
			m.fail("%s's admission after takes at once refused (%s / %s): Redis says spent by %q", b.name, outs[0], outs[1], c)
		}
		return
	}
	k := fresh[0]
	req := ts[k].key + " " + ts[k].fingerprint()
	if g, seen := m.q.gates[req]; c == "" || seen && c != g {
		m.fail("%s's admission after takes at once (%s committed): Redis says spent by %q", b.name, ts[k].key, c)
	}
	b.claim, b.claimReq, m.q.gates[req] = c, req, c
	m.qTaken(ts[k], bodies[k], rs[k], p.token, p)
}

// queueRetry sends a committed take again, with its token or the token of
// another of its buyer's places: its answer again, and nothing moves.
func (m *sim) queueRetry() {
	if len(m.q.done) == 0 {
		return
	}
	d := m.q.done[m.rng.IntN(len(m.q.done))]
	b := m.qBuyer(d.t.buyer)
	token, p := d.token, d.place
	if m.rng.IntN(3) == 0 {
		p = b.places[m.rng.IntN(len(b.places))]
		token = p.token
	}
	body := d.body
	if d.t.cart {
		body = m.body(d.t) // its lines in another order
	}
	m.ops["queue-retry"]++
	m.qSend(m.env(), d.t, body, qOwn, token, p)
}

// queueReuse sends another take with a committed take's key: another
// quantity, the other ticket, or a hold instead of a purchase.
func (m *sim) queueReuse() {
	if len(m.q.done) == 0 {
		return
	}
	d := m.q.done[m.rng.IntN(len(m.q.done))]
	t := d.t
	t.lines = slices.Clone(t.lines)
	switch r := m.rng.IntN(3); {
	case r == 0 || t.cart:
		l := &t.lines[m.rng.IntN(len(t.lines))]
		l.q = l.q%2 + 1
	case r == 1:
		s := m.q.skus[0]
		if t.lines[0].sku == s {
			s = m.q.skus[1]
		}
		t.lines[0].sku = s
		t.path = strings.Replace(t.path, "/"+d.t.lines[0].sku.ticket()+"/", "/"+s.ticket()+"/", 1)
	case t.hold:
		t.hold, t.ttl, t.path = false, 0, strings.TrimSuffix(t.path, "/holds")+"/purchases"
	default:
		t.hold, t.ttl, t.path = true, 900, strings.TrimSuffix(t.path, "/purchases")+"/holds"
	}
	if t.fingerprint() == d.t.fingerprint() {
		return
	}
	m.ops["queue-reuse"]++
	m.qSend(m.env(), t, m.body(t), qOwn, d.token, d.place)
}

// queueSettle confirms or cancels a live hold or held cart of the queued
// program (no admission needed), so that its holds end and it can sell
// out.
func (m *sim) queueSettle() {
	var hs []*mHold
	for _, h := range m.holds {
		if h.sku.sku.Program == m.q.program && h.live() && (h.cart == nil || h.cart.live()) {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return
	}
	h := hs[m.rng.IntN(len(hs))]
	action := []string{"confirm", "cancel"}[m.rng.IntN(2)]
	m.ops["queue-"+action]++
	if c := h.cart; c != nil {
		m.cartDo(c, action, c.take.buyer)
		return
	}
	if action == "cancel" {
		m.act("/v1/holds/"+h.id+"/cancel", h.buyer, http.StatusOK)
		h.state = ledger.Cancelled
		h.sku.held -= h.q
		return
	}
	r := m.act("/v1/holds/"+h.id+"/confirm", h.buyer, http.StatusCreated)
	h.state = ledger.Confirmed
	h.sku.held -= h.q
	h.sku.sold += h.q
	m.orders = append(m.orders, &mOrder{id: systest.OrderID(r), sku: h.sku, buyer: h.buyer, q: h.q})
}

// queueRestock adds 1 or 2 units to a queued ticket (up to 6) while the
// program is sold out: the line opens again.
func (m *sim) queueRestock() {
	s := m.q.skus[m.rng.IntN(len(m.q.skus))]
	if m.q.soldOutSince.IsZero() || s.total >= 6 {
		return
	}
	m.ops["queue-restock"]++
	s.total += int64(1 + m.rng.IntN(2))
	m.put(m.env(), s)
}

// qPost sends a take with its Idempotency-Key and Admission-Token (none
// when token is "").
func (m *sim) qPost(e *systest.Env, path, key, token, body string) systest.Reply {
	m.t.Helper()
	h := map[string]string{"Idempotency-Key": key}
	if token != "" {
		h["Admission-Token"] = token
	}
	r := e.Do(m.t, http.MethodPost, path, h, body)
	m.tracef("POST %s key %s token %.24q %s on %d = %d %s (replayed %q)", path, key, token, body, slices.Index(m.envs, e), r.Status, r.Body, r.Header.Get("Idempotent-Replayed"))
	return r
}

// qClaim is the gate id of the request the ledger says spent b's
// admission (it keeps them across any loss of Redis), or "".
func (m *sim) qClaim(b *mQBuyer) string {
	ctx := context.Background()
	l := m.envs[0].Ledger
	c, err := l.Queue(ctx, m.q.program)
	if err != nil {
		m.fail("queue: %v", err)
	}
	spends, err := l.AdmissionSpends(ctx, m.q.program, c.Room())
	if err != nil {
		m.fail("queue claims: %v", err)
	}
	for _, sp := range spends {
		if sp.Buyer.String() == b.name {
			return sp.Request.String()
		}
	}
	return ""
}

// qCommitted is the committed take of buyer with key, or nil.
func (m *sim) qCommitted(buyer, key string) *mQDone {
	for _, d := range m.q.done {
		if d.t.buyer == buyer && d.t.key == key {
			return d
		}
	}
	return nil
}

// qOutcome names an answer to a take: new, replay, or its status and
// problem.
func qOutcome(r systest.Reply) string {
	if r.Status == http.StatusCreated {
		if r.Header.Get("Idempotent-Replayed") == "true" {
			return "replay"
		}
		return "new"
	}
	return fmt.Sprintf("%d %s", r.Status, systest.ProblemKind(r))
}

// qWant is the answers the model allows a take of the queued program.
type qWant struct {
	outcomes map[string]bool
	// refusals are the take's own (kind → the tickets it may name, "*":
	// none), once its admission is spent on it; closed, a sold-out refusal
	// before the admission is looked at.
	refusals map[string]map[string]bool
	closed   bool
}

// qWant predicts the answers to take t, sent with a token of kind, while
// its buyer's admission was held by claimReq's request (gate id claim, ""
// none), its place admitted as a1 said before it was sent (at ts) and a2
// after it was answered (at tr).
func (m *sim) qWant(t mTake, kind int, claim, claimReq string, a1, a2 qAdm, ts, tr time.Time) qWant {
	w := qWant{outcomes: map[string]bool{}, refusals: map[string]map[string]bool{}}
	d := m.qCommitted(t.buyer, t.key)
	// lookup is a refusal that first looks the request up: a committed
	// one's answer instead.
	lookup := func(refusal string) {
		switch {
		case d != nil && d.t.fingerprint() == t.fingerprint():
			w.outcomes["replay"] = true
		case d != nil:
			w.outcomes["422 idempotency-key-reused"] = true
		default:
			w.outcomes[refusal] = true
		}
	}
	take := func() {
		if d != nil {
			lookup("")
			return
		}
		for _, l := range t.lines {
			kind, ticket := "", l.sku.ticket()
			switch {
			case !t.cart && l.q > 4:
				kind = "quantity-over-limit"
			case l.sku.left() < l.q:
				kind = "sold-out"
			}
			if kind != "" {
				if w.refusals[kind] == nil {
					w.refusals[kind] = map[string]bool{}
				}
				w.refusals[kind][ticket] = true
			}
		}
		if len(w.refusals) == 0 {
			w.outcomes["new"] = true
		}
	}
	// A purchase or hold of a sold-out ticket is refused before anything,
	// unless its key committed a request of that ticket.
	if l := t.lines[0]; !t.cart && l.sku.left() < l.q && (d == nil || d.t.cart || d.t.lines[0].sku != l.sku) {
		w.closed = true
	}
	req := t.key + " " + t.fingerprint()
	window := qWindow.Milliseconds()
	switch {
	case kind == qNone:
		w.outcomes["403 admission-required"] = true
	case kind != qOwn:
		w.outcomes["403 admission-invalid"] = true
	case claim != "" && claimReq == req:
		take() // spent on this request before
	case claim != "":
		lookup("409 admission-used")
	default:
		if !a1.ok || !a2.ok {
			// Not admitted (yet, or again: a line lost and not made again,
			// or made again with fewer admitted). A committed request is
			// answered its replay.
			lookup("403 admission-invalid")
		}
		for _, a := range []qAdm{a1, a2} {
			if !a.ok {
				continue
			}
			if tr.UnixMilli() > a.at+window {
				lookup("410 admission-expired")
			}
			if ts.UnixMilli() <= a.at+window {
				take()
			}
		}
	}
	return w
}

// allows says whether the model allows answer r.
func (w qWant) allows(r systest.Reply, cart bool) bool {
	out, kind, named := qOutcome(r), systest.ProblemKind(r), problemLines(r)
	switch {
	case w.outcomes[out]:
		return true
	case w.closed && out == "409 sold-out" && len(named) == 0:
		return true
	case w.refusals[kind] == nil || r.Status != map[string]int{"sold-out": http.StatusConflict, "quantity-over-limit": http.StatusUnprocessableEntity}[kind]:
		return false
	case !cart:
		return len(named) == 0
	case len(named) == 1:
		return named[0].Code == kind && w.refusals[kind][named[0].Ticket]
	}
	return false
}

// qSend sends a take of the queued program (again with its key while the
// answer is a stale sold-out or a 503, for at most falseSoldOutBound),
// checks the answer and the buyer's claim in Redis against the model, and
// applies them.
func (m *sim) qSend(e *systest.Env, t mTake, body string, kind int, token string, p *mPlace) {
	m.t.Helper()
	b := m.qBuyer(t.buyer)
	req := t.key + " " + t.fingerprint()
	start := time.Now()
	saw503 := false
	for {
		claim, claimReq := b.claim, b.claimReq
		var a1, a2 qAdm
		if kind == qOwn {
			a1 = m.qAdmissionOf(p)
		}
		ts := time.Now()
		r := m.qPost(e, t.path, t.key, token, body)
		tr := time.Now()
		if kind == qOwn {
			a2 = m.qAdmissionOf(p)
		}
		out := qOutcome(r)
		m.qClaimed(b, req, out)
		if r.Status == http.StatusServiceUnavailable {
			// Retried with the same key; a spent admission stays spent.
			if time.Since(start) > falseSoldOutBound {
				m.fail("POST %s %s key %s still %d after %v: %s", t.path, body, t.key, r.Status, time.Since(start), r.Body)
			}
			saw503 = true
			m.ops["queue-busy"]++
			time.Sleep(20 * time.Millisecond) // poll interval
			continue
		}
		w := m.qWant(t, kind, claim, claimReq, a1, a2, ts, tr)
		if !w.allows(r, t.cart) && out == "new" && m.settleExpiries(tr) {
			// A hold due before the answer may have given its stock back
			// in time for it.
			w = m.qWant(t, kind, claim, claimReq, a1, a2, ts, tr)
		}
		if saw503 && out == "replay" && w.outcomes["new"] {
			out = "new" // committed by an attempt answered 503
		}
		if w.allows(r, t.cart) || out == "new" && w.outcomes["new"] {
			m.ops["queue-"+out]++
			switch out {
			case "new":
				m.qTaken(t, body, r, token, p)
			case "replay":
				if d := m.qCommitted(t.buyer, t.key); systest.ReplyID(r) != d.id {
					m.fail("retry of %s key %s = %s, want the replay of %s", t.path, t.key, r.Body, d.id)
				}
			}
			return
		}
		// Stale: a sold-out answer naming only lines that have the stock
		// (a replica's flag from before stock came back), or naming none
		// while every line has it. Another line may truly lack it: the
		// answer after the flag's re-check names that one.
		stale := out == "409 sold-out"
		named := problemLines(r)
		for _, l := range t.lines {
			isNamed := len(named) == 0
			for _, n := range named {
				isNamed = isNamed || n.Ticket == l.sku.ticket()
			}
			stale = stale && (!isNamed || l.sku.left() >= l.q)
		}
		if !stale || time.Since(start) > falseSoldOutBound {
			var left []int64
			for _, s := range m.q.skus {
				left = append(left, s.left())
			}
			m.fail("POST %s %s key %s token %d (%.30q, place %v) = %s %s after %v; claim %q of %q; admitted before %+v, after %+v (window from %v, sent %v, answered %v); left %v; allowed %v, refusals %v, closed %v",
				t.path, body, t.key, kind, token, p != nil, out, r.Body, time.Since(start).Round(time.Millisecond), claim, claimReq, a1, a2,
				time.UnixMilli(a2.at).Format("15:04:05.000"), ts.Format("15:04:05.000"), tr.Format("15:04:05.000"), left, w.outcomes, w.refusals, w.closed)
		}
		m.ops["queue-stale-sold-out"]++
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

// qClaimed checks the claim Redis has of b's admission after req's answer
// out, and applies it: a request that does not hold it leaves another's
// alone; one that committed holds it; one refused lets it go if it held it
// (a refusal that moved nothing gives the admission back).
func (m *sim) qClaimed(b *mQBuyer, req, out string) {
	c := m.qClaim(b)
	var ok bool
	switch {
	case b.claim != "" && b.claimReq != req:
		ok = c == b.claim
	case out == "new":
		ok = c != "" && (b.claim == "" || c == b.claim)
	case out == "replay", strings.HasPrefix(out, "503"):
		ok = c == "" || c == b.claim || b.claim == ""
	default:
		ok = c == "" || c == b.claim
	}
	if g, seen := m.q.gates[req]; ok && c != "" && c != b.claim && seen {
		ok = c == g
	}
	if !ok {
		m.fail("%s's admission after %s (%s): Redis says spent by %q, the model by %q (%s)", b.name, req, out, c, b.claim, b.claimReq)
	}
	switch {
	case c == "":
		b.claim, b.claimReq = "", ""
	case c != b.claim:
		b.claim, b.claimReq = c, req
		m.q.gates[req] = c
	}
}

// qTaken applies a new take of the queued program: the model's holds,
// orders and carts as any take's, and its request kept for retries with
// its token.
func (m *sim) qTaken(t mTake, body string, r systest.Reply, token string, p *mPlace) {
	b := m.qBuyer(t.buyer)
	if b.bought++; b.bought > 1 {
		m.fail("%s bought twice on one admission: %s key %s = %s", b.name, t.path, t.key, r.Body)
	}
	m.taken(t, body, r)
	// The model's other operations retry its requests without a token.
	d := m.done[len(m.done)-1]
	m.done = m.done[:len(m.done)-1]
	m.q.done = append(m.q.done, &mQDone{t: t, body: body, id: d.id, token: token, place: p})
}

// queueStepped notes when the queued program's ledger becomes sold out
// (nothing left nor held) and when it stops being so: a step's end is
// after any change it made.
func (m *sim) queueStepped() {
	var left, held int64
	for _, s := range m.q.skus {
		left += s.left()
		held += s.held
	}
	if left == 0 && held == 0 {
		m.ops["queue-sold-out-steps"]++
	}
	switch out := left == 0 && held == 0; {
	case out && m.q.soldOutSince.IsZero():
		m.q.soldOutSince = time.Now()
		m.ops["queue-sold-out"]++
		m.tracef("the queued program is sold out")
	case !out && !m.q.soldOutSince.IsZero():
		m.q.soldOutSince, m.q.reopened = time.Time{}, time.Now()
		m.tracef("the queued program has stock again")
	}
}

// queueFlushing notes when each place was admitted before Redis loses it.
func (m *sim) queueFlushing() {
	bs := m.qAdmissions()
	for _, p := range m.q.all {
		m.qOf(bs, p)
	}
}

// queueFlushed applies the loss of everything in Redis: the buyers'
// places are forgotten (kept by their tickets); their spent admissions are
// not (the ledger keeps them, and a restore puts them back).
func (m *sim) queueFlushed() {
	q := m.q
	q.flushedAt, q.marks = time.Now(), nil
	for _, b := range q.buyers {
		b.place = nil
	}
}

// qView is the admin view of the line.
type qView struct {
	Joined  int64 `json:"joined"`
	Serving int64 `json:"serving"`
	SoldOut bool  `json:"sold_out"`
}

func (m *sim) qView() qView {
	r := m.env().Do(m.t, http.MethodGet, "/v1/admin/programs/"+m.q.program.String()+"/queue", nil, "")
	var v qView
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &v) != nil {
		m.fail("GET queue = %d %s", r.Status, r.Body)
	}
	return v
}

// checkQueue compares the admin view of the line with what Redis says of
// each place, and while sold out, the answers of checks and the
// admissions; every fifth time and at the end (final), the units the
// ledger counts for each buyer who joined (only they can be admitted) with
// the model's.
func (m *sim) checkQueue(final bool) {
	defer m.queueTimed(time.Now())
	q := m.q
	ctx := context.Background()
	if q.checks++; q.checks%5 == 0 || final {
		m.checkQueueBuyers()
	}
	// What the pacer last recorded in the ledger.
	ln, err := m.envs[0].Ledger.QueueLine(ctx, q.program)
	if err != nil {
		m.fail("ledger queue line: %v", err)
	}
	if n := len(q.ledgerMarks); n == 0 || q.ledgerMarks[n-1].pos < ln.Serving {
		q.ledgerMarks = append(q.ledgerMarks, qMark{pos: ln.Serving, at: time.Now()})
	}
	// The serving counter, read before and after Redis' admissions: each
	// place up to the first is admitted, none past the second. (A line
	// Redis lost is answered from the ledger's facts until restored.)
	start := time.Now()
	lost := m.qLost()
	v1 := m.qView()
	adm := make([]qAdm, len(q.all))
	bs := m.qAdmissions()
	for i, p := range q.all {
		adm[i] = m.qOf(bs, p)
	}
	v2 := m.qView()
	if !lost && !m.qLost() {
		for i, p := range q.all {
			if p.pos <= v1.Serving && !adm[i].ok || p.pos > v2.Serving && adm[i].ok {
				m.fail("position %d (%s): Redis says admitted %v, the line's serving counter was %d then %d", p.pos, p.buyer.name, adm[i].ok, v1.Serving, v2.Serving)
			}
		}
		if v2.Joined < q.maxPos || q.flushedAt.IsZero() && v2.Joined != q.maxPos {
			m.fail("the line says %d joined, %d places were given", v2.Joined, q.maxPos)
		}
	}
	switch {
	case !q.soldOutSince.IsZero() && !v1.SoldOut:
		m.fail("the line is not sold out, the ledger has nothing left nor held since %v", time.Since(q.soldOutSince))
	case q.soldOutSince.IsZero() && v2.SoldOut && (q.reopened.IsZero() || start.After(q.reopened.Add(falseSoldOutBound))):
		m.fail("the line is sold out, the ledger has stock since %v", q.reopened)
	}
	if q.soldOutSince.IsZero() {
		return
	}
	// Sold out: no admission since (a pacer's step reads the ledger after
	// its time), unless a restore after a FLUSHALL stamped one anew; and
	// every check says so once a refresh has passed.
	if q.flushedAt.Before(q.soldOutSince) {
		k := keys.Queue(q.program)
		v, err := m.envs[0].Redis.ZRangeByScoreWithScores(ctx, k.Batches(), &redis.ZRangeBy{Min: strconv.FormatInt(q.soldOutSince.UnixMilli(), 10), Max: "+inf"}).Result()
		if err != nil {
			m.fail("queue batches: %v", err)
		}
		if len(v) > 0 {
			m.fail("admitted while sold out (since %s): batches %v", q.soldOutSince.Format("15:04:05.000"), v)
		}
	}
	if time.Since(q.soldOutSince) < qFresh {
		return
	}
	for _, e := range m.envs {
		for range 2 {
			if len(q.all) > 0 {
				m.qCheckOn(e, q.all[m.rng.IntN(len(q.all))])
			}
		}
	}
}

// checkQueueBuyers compares the units the ledger counts for each buyer
// who joined, over the queued program, with the model's.
func (m *sim) checkQueueBuyers() {
	ctx := context.Background()
	for attempt := 0; ; attempt++ {
		var diff []string
		for _, b := range m.q.buyers {
			if len(b.places) == 0 {
				continue
			}
			got, err := m.envs[0].Ledger.ProgramUnits(ctx, m.q.program, keys.MustID(b.name))
			if err != nil {
				m.fail("program units: %v", err)
			}
			if want := m.units(b.name, nil); got != want {
				diff = append(diff, fmt.Sprintf("%s: ledger %d, model %d", b.name, got, want))
			}
		}
		if len(diff) == 0 {
			return
		}
		if attempt == 2 {
			m.fail("queued buyers' units: %s", strings.Join(diff, "; "))
		}
		m.settleExpiries(time.Now())
	}
}

// checkQueueMoves checks that the line moves while stock is left: a place
// waiting is admitted, or one more past the serving counter, within a
// window and a bound (admitted buyers who walk away lapse in a window).
func (m *sim) checkQueueMoves() {
	defer m.queueTimed(time.Now())
	var left int64
	for _, s := range m.q.skus {
		left += s.left()
	}
	v := m.qView()
	if left == 0 || v.Serving >= m.q.maxPos {
		return
	}
	deadline := time.Now().Add(qWindow + falseSoldOutBound)
	for m.qView().Serving == v.Serving {
		if time.Now().After(deadline) {
			m.fail("the line stands at %d of %d places with %d units left", v.Serving, m.q.maxPos, left)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}
