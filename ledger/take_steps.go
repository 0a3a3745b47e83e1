package ledger

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"time"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// A take batch's statements: the reads of a careful attempt (rows locked,
// buyers' counts, code uses, requests committed meanwhile), and the
// writes of one attempt, each a step of the pipeline (pipe.go) whose rows
// it reads back.

// readRows is what a careful attempt reads before it writes.
type readRows struct {
	rows      map[stock.SKU]skuRow
	buyers    map[buyerName][2]int64 // units, cap; nil unless caps are read
	codes     map[codeName]codeRow   // nil unless codes are read
	committed map[ScopedKey]bool     // the kept takes' requests committed meanwhile
}

// readFirst locks and reads the rows of skus, and the buyers' counts and
// code uses when an attempt before found them refusing, and which of the
// kept takes' requests committed meanwhile.
func (b *takeBatch) readFirst(ctx context.Context, r txRunner, kept []int, lines []tline, skus []stock.SKU) (readRows, error) {
	rd := readRows{rows: map[stock.SKU]skuRow{}, committed: map[ScopedKey]bool{}}
	steps := []step{b.lockStep(skus, rd.rows)}
	if b.readCaps {
		rd.buyers = map[buyerName][2]int64{}
		steps = append(steps, b.buyersReadStep(lines, rd.buyers))
	}
	if b.readCodes {
		rd.codes = map[codeName]codeRow{}
		if s, ok := b.codesReadStep(lines, rd.codes); ok {
			steps = append(steps, s)
		}
	}
	if s, ok := b.requestsReadStep(kept, rd.committed); ok {
		steps = append(steps, s)
	}
	if err := r.run(ctx, steps); err != nil {
		return rd, notCommitted("take: read", err)
	}
	return rd, nil
}

// requestsReadStep reads which of the takes' requests are committed
// already (found); ok is false when no take names a request.
func (b *takeBatch) requestsReadStep(kept []int, found map[ScopedKey]bool) (step, bool) {
	in := newRowset("tt")
	for _, i := range kept {
		if r := b.takes[i].Req; !r.IsZero() {
			in.add(r.Scope.String(), r.Key.String())
		}
	}
	if in.n == 0 {
		return step{}, false
	}
	return step{sql: b.l.sql.requestsRead, args: in.args(b.l.driver), read: func(rs resultRows) error {
		var k ScopedKey
		if err := rs.Scan(&k.Scope, &k.Key); err != nil {
			return err
		}
		found[k] = true
		return nil
	}}, true
}

// lockStep locks the SKU rows, in (program, ticket) order, and reads them
// into rows.
func (b *takeBatch) lockStep(skus []stock.SKU, rows map[stock.SKU]skuRow) step {
	return b.l.lockStep(skus, rows)
}

// lockStep locks the SKU rows of skus (sorted), in their order, and reads
// them into rows (nil: not read). Every batch that changes several SKU
// rows takes them this way first, so no two wait on each other in a
// cycle.
func (l *Ledger) lockStep(skus []stock.SKU, rows map[stock.SKU]skuRow) step {
	in := newRowset("tt")
	for _, s := range skus {
		in.add(s.Program.String(), s.Ticket.String())
	}
	return step{sql: l.sql.takeLock, args: in.args(l.driver), read: func(rs resultRows) error {
		if rows == nil {
			return nil
		}
		var sku stock.SKU
		var r skuRow
		var ended, seated int64
		if err := rs.Scan(&sku.Program, &sku.Ticket, &r.total, &r.sold, &r.held, &r.version, &r.epoch, &ended, &seated); err != nil {
			return err
		}
		r.ended, r.seated = ended > 0, seated == 1
		rows[sku] = r
		return nil
	}}
}

// buyerRows are the buyer_units rows the lines count into, in the one
// order every stock write takes them in: each ticket's rows (tickets in
// order, buyers in order), then each program's.
func buyerRows(lines []tline) []buyerRow {
	units := map[buyerName]int64{}
	for _, ln := range lines {
		base := ln.sku.Base()
		units[buyerName{base.Program, base.Ticket, ln.buyer}] += ln.q
		units[buyerName{ln.sku.Program, keys.ID{}, ln.buyer}] += ln.q
	}
	names := slices.SortedFunc(maps.Keys(units), func(a, b buyerName) int {
		// Ticket rows before program rows (an empty ticket), then by name.
		if c := cmp.Compare(boolInt(a.ticket.IsZero()), boolInt(b.ticket.IsZero())); c != 0 {
			return c
		}
		if c := a.program.Compare(b.program); c != 0 {
			return c
		}
		if c := a.ticket.Compare(b.ticket); c != 0 {
			return c
		}
		return a.buyer.Compare(b.buyer)
	})
	out := make([]buyerRow, len(names))
	for i, n := range names {
		out[i] = buyerRow{stock.SKU{Program: n.program, Ticket: n.ticket}, n.buyer, units[n]}
	}
	return out
}

// buyersReadStep reads the buyers' counts and caps of the lines' rows.
func (b *takeBatch) buyersReadStep(lines []tline, into map[buyerName][2]int64) step {
	in := newRowset("ttt")
	for _, r := range buyerRows(lines) {
		in.add(r.sku.Program.String(), r.sku.Ticket.String(), r.buyer.String())
	}
	return step{sql: b.l.sql.buyersRead, args: in.args(b.l.driver), read: func(rs resultRows) error {
		var n buyerName
		var units, cap int64
		if err := rs.Scan(&n.program, &n.ticket, &n.buyer, &units, &cap); err != nil {
			return err
		}
		into[n] = [2]int64{units, cap}
		return nil
	}}
}

// codesReadStep reads the lines' access codes and their standing uses.
func (b *takeBatch) codesReadStep(lines []tline, into map[codeName]codeRow) (step, bool) {
	in := newRowset("ttt")
	seen := map[codeName]bool{}
	for _, ln := range lines {
		if c := (codeName{ln.sku, ln.code}); ln.code != "" && !seen[c] {
			seen[c] = true
			in.add(ln.sku.Program.String(), ln.sku.Ticket.String(), ln.code)
		}
	}
	if in.n == 0 {
		return step{}, false
	}
	return step{sql: b.l.sql.codesRead, args: in.args(b.l.driver), read: func(rs resultRows) error {
		var c codeName
		var r codeRow
		if err := rs.Scan(&c.sku.Program, &c.sku.Ticket, &c.hash, &r.maxUses, &r.buyer, &r.uses); err != nil {
			return err
		}
		into[c] = r
		return nil
	}}, true
}

// writes are an attempt's write statements and what they report.
type writes struct {
	seats     step   // seats first (empty sql: no seat lines)
	steps     []step // the SKU rows, requests, rows, buyers, codes, events
	updated   map[stock.SKU]updatedRow
	claimed   map[ScopedKey]bool
	inserted  map[keys.ID]bool
	seatsGot  map[seatName]bool
	buyerRows []buyerRow
	counted   map[buyerName]bool
	codes     map[codeName]codeRow
	codeFound map[codeName]bool
}

// updatedRow is what a SKU's update said of its row: the gate epoch the
// stock was taken under, and the caps its buyers' counts are under (the
// ticket's, which its pools share, and its program's).
type updatedRow struct {
	epoch, perBuyer, programCap int64
}

// capped are the buyer rows under a cap, as the SKUs' updates read the
// caps (a ticket's pools share its cap).
func (w *writes) capped() []buyerRow {
	skuCap, programCap := map[stock.SKU]bool{}, map[keys.ID]bool{}
	for sku, u := range w.updated {
		if u.perBuyer > 0 {
			skuCap[sku.Base()] = true
		}
		if u.programCap > 0 {
			programCap[sku.Program] = true
		}
	}
	var out []buyerRow
	for _, r := range w.buyerRows {
		if (r.sku.Ticket.IsZero() && programCap[r.sku.Program]) || (!r.sku.Ticket.IsZero() && skuCap[r.sku]) {
			out = append(out, r)
		}
	}
	return out
}

// buyersStep counts rows (in the order given) under their caps; counted
// gets the rows written. A row not written was refused by its cap.
func (l *Ledger) buyersStep(rows []buyerRow, counted map[buyerName]bool) step {
	bu := newRowset("ttti")
	for _, r := range rows {
		bu.add(r.sku.Program.String(), r.sku.Ticket.String(), r.buyer.String(), r.units)
	}
	return step{sql: l.sql.takeBuyers, args: bu.args(l.driver), read: func(rs resultRows) error {
		var n buyerName
		if err := rs.Scan(&n.program, &n.ticket, &n.buyer); err != nil {
			return err
		}
		counted[n] = true
		return nil
	}}
}

// writeSteps builds the set-based statements of takes[kept] and lines, in
// the order they run: the SKUs' updates, the requests' claims, the order
// and hold rows, the access codes, the events (the seats are a step of
// their own, run first).
func (b *takeBatch) writeSteps(d string, kept []int, lines []tline) *writes {
	w := &writes{updated: map[stock.SKU]updatedRow{}, claimed: map[ScopedKey]bool{}, inserted: map[keys.ID]bool{},
		seatsGot: map[seatName]bool{}, counted: map[buyerName]bool{}, codes: map[codeName]codeRow{}, codeFound: map[codeName]bool{}}
	b.seatsStep(w, d, lines)
	skus := b.updateStep(w, d, lines)

	// The requests, with their answers and the row version they made.
	var claims []claimRow
	for _, i := range kept {
		if t := &b.takes[i]; !t.Req.IsZero() {
			claims = append(claims, claimRow{req: t.Req, sku: b.claimSKU(i), answer: b.answer(i)})
		}
	}
	if len(claims) > 0 {
		w.steps = append(w.steps, b.l.claimsStep(b.now, claims, w.claimed))
	}
	b.rowSteps(w, d, lines)

	// The buyers' counts: only under a cap, so only once the SKUs'
	// updates have said which rows have one (see buyersStep).
	w.buyerRows = buyerRows(lines)
	b.codeSteps(w, d, lines)

	// Events last, after every row they are about: each line's, then a
	// sale.sold_out for each SKU the attempt left with nothing.
	var events []Event
	for _, ln := range lines {
		t := &b.takes[ln.take]
		var e Event
		if ln.hold {
			e = holdEvent(EventHoldCreated, t.Holds[ln.idx])
		} else {
			e = orderEvent(EventOrderCreated, t.Orders[ln.idx])
		}
		e.Trace = t.Req.Trace // a cart's lines carry no request of their own
		events = append(events, e)
	}
	w.steps = append(w.steps, b.l.eventsStep(b.now, events, skus))
	return w
}

// seatsStep sets w.seats: the lines' seats, held by their hold or sold to
// their order.
func (b *takeBatch) seatsStep(w *writes, d string, lines []tline) {
	seats := newRowset("ttttt")
	for _, ln := range lines {
		state := seatSold
		if ln.hold {
			state = seatHeld
		}
		for _, s := range slices.SortedFunc(slices.Values(ln.seats), keys.ID.Compare) {
			seats.add(ln.sku.Program.String(), ln.sku.Ticket.String(), s.String(), ln.id.String(), state)
		}
	}
	if seats.n == 0 {
		return
	}
	w.seats = step{sql: b.l.sql.takeSeats, args: seats.args(d), read: func(rs resultRows) error {
		var s seatName
		if err := rs.Scan(&s.sku.Program, &s.sku.Ticket, &s.seat); err != nil {
			return err
		}
		w.seatsGot[s] = true
		return nil
	}}
}

// updateStep adds one conditional update per SKU, for the sum of its
// lines, and returns the SKUs in order.
func (b *takeBatch) updateStep(w *writes, d string, lines []tline) []stock.SKU {
	type delta struct{ sold, held, epoch, counted int64 }
	deltas := map[stock.SKU]*delta{}
	for _, ln := range lines {
		dl := deltas[ln.sku]
		if dl == nil {
			dl = &delta{epoch: ln.epoch}
			deltas[ln.sku] = dl
		}
		if ln.hold {
			dl.held += ln.q
		} else {
			dl.sold += ln.q
		}
		if len(ln.seats) == 0 {
			dl.counted = 1
		}
		if dl.epoch != ln.epoch {
			dl.epoch = -2 // lines of two epochs: the update refuses, and the careful attempt tells them apart
		}
	}
	bypass := int64(0)
	if b.direct {
		bypass = 1
	}
	skus := slices.SortedFunc(maps.Keys(deltas), stock.SKU.Compare)
	upd := newRowset("ttiiiii")
	for _, sku := range skus {
		dl := deltas[sku]
		upd.add(sku.Program.String(), sku.Ticket.String(), dl.sold, dl.held, dl.epoch, dl.counted, bypass)
	}
	w.steps = append(w.steps, step{sql: b.l.sql.takeUpdate, args: append([]any{b.now.UnixMilli()}, upd.args(d)...), read: func(rs resultRows) error {
		var sku stock.SKU
		var u updatedRow
		if err := rs.Scan(&sku.Program, &sku.Ticket, &u.epoch, &u.perBuyer, &u.programCap); err != nil {
			return err
		}
		w.updated[sku] = u
		return nil
	}})
	return skus
}

// rowSteps adds the lines' order and hold rows.
func (b *takeBatch) rowSteps(w *writes, d string, lines []tline) {
	var orders []Order
	var holds []Hold
	for _, ln := range lines {
		t := &b.takes[ln.take]
		if ln.hold {
			h := t.Holds[ln.idx]
			h.TakeEpoch = ln.epoch
			holds = append(holds, h)
			continue
		}
		o := t.Orders[ln.idx]
		o.TakeEpoch = ln.epoch
		orders = append(orders, o)
	}
	if len(orders) > 0 {
		w.steps = append(w.steps, b.l.ordersStep(b.now, orders, w.inserted))
		// An organizer's orders (comps, box office) say so beside them; a
		// buyer's purchase writes nothing more.
		chans := newRowset("tt")
		for _, o := range orders {
			if o.Channel != "" {
				chans.add(o.ID.String(), o.Channel)
			}
		}
		if chans.n > 0 {
			w.steps = append(w.steps, step{sql: b.l.sql.takeChannels, args: chans.args(d)})
		}
	}
	if len(holds) > 0 {
		hs := newRowset("tttttittiittt")
		for _, h := range holds {
			hs.add(h.ID.String(), h.IdempotencyKey.String(), h.RequestHash, h.SKU.Program.String(), h.SKU.Ticket.String(),
				h.Quantity, h.Buyer.String(), h.Gate, h.ExpiresAt.UnixMilli(), h.TakeEpoch, keys.Join(h.SeatIDs, ","),
				h.CartID.String(), h.CodeHash)
		}
		w.steps = append(w.steps, step{sql: b.l.sql.takeHolds, args: append([]any{b.now.UnixMilli()}, hs.args(d)...), read: readKeys(w.inserted)})
	}
}

// codeSteps adds the access codes, after the rows that use them: each
// code's row locked, its standing uses counted with this attempt's.
func (b *takeBatch) codeSteps(w *writes, d string, lines []tline) {
	cs := newRowset("ttt")
	seenCode := map[codeName]bool{}
	for _, ln := range lines {
		c := codeName{ln.sku, ln.code}
		if ln.code != "" && !seenCode[c] {
			seenCode[c] = true
			w.codes[c] = codeRow{}
		}
	}
	if len(seenCode) == 0 {
		return
	}
	for _, c := range slices.SortedFunc(maps.Keys(seenCode), func(a, b codeName) int {
		if v := a.sku.Compare(b.sku); v != 0 {
			return v
		}
		return cmp.Compare(a.hash, b.hash)
	}) {
		cs.add(c.sku.Program.String(), c.sku.Ticket.String(), c.hash)
	}
	w.steps = append(w.steps, step{sql: b.l.sql.takeCodesLock, args: cs.args(d)}, step{sql: b.l.sql.codesRead, args: cs.args(d),
		read: func(rs resultRows) error {
			var c codeName
			var r codeRow
			if err := rs.Scan(&c.sku.Program, &c.sku.Ticket, &c.hash, &r.maxUses, &r.buyer, &r.uses); err != nil {
				return err
			}
			w.codes[c], w.codeFound[c] = r, true
			return nil
		}})
}

// claimsStep claims the requests in one global order (scope, key): two
// batches that share requests (a retry sent to two replicas) wait on
// each other's claims in the same order, never in a cycle. claimed gets
// the keys claimed; a key missing from it was taken already.
func (l *Ledger) claimsStep(now time.Time, claims []claimRow, claimed map[ScopedKey]bool) step {
	claims = slices.Clone(claims)
	slices.SortFunc(claims, func(a, b claimRow) int {
		if c := a.req.Scope.Compare(b.req.Scope); c != 0 {
			return c
		}
		return a.req.Key.Compare(b.req.Key)
	})
	rs := newRowset("ttttttt")
	for _, c := range claims {
		rs.add(c.req.Scope.String(), c.req.Key.String(), c.req.Fingerprint, c.req.Op, c.sku.Program.String(), c.sku.Ticket.String(), c.answer)
	}
	return step{sql: l.sql.takeClaims, args: append([]any{now.UnixMilli()}, rs.args(l.driver)...), read: func(r resultRows) error {
		var k ScopedKey
		if err := r.Scan(&k.Scope, &k.Key); err != nil {
			return err
		}
		claimed[k] = true
		return nil
	}}
}

// ordersStep inserts order rows (TakeEpoch -1: the row's epoch at the
// insert); inserted gets the row keys inserted.
func (l *Ledger) ordersStep(now time.Time, orders []Order, inserted map[keys.ID]bool) step {
	rs := newRowset("ttttttitttittt")
	for _, o := range orders {
		rs.add(o.ID.String(), o.IdempotencyKey.String(), o.RequestHash, o.SKU.Program.String(), o.SKU.Ticket.String(),
			o.Buyer.String(), o.Quantity, o.Gate, o.GateKey.String(), o.HoldID.String(), o.TakeEpoch, o.CartID.String(), o.CodeHash,
			keys.Join(o.SeatIDs, ","))
	}
	return step{sql: l.sql.takeOrders, args: append([]any{now.UnixMilli()}, rs.args(l.driver)...), read: readKeys(inserted)}
}

// readKeys reads a RETURNING idem_key into into.
func readKeys(into map[keys.ID]bool) func(resultRows) error {
	return func(rs resultRows) error {
		var k keys.ID
		if err := rs.Scan(&k); err != nil {
			return err
		}
		into[k] = true
		return nil
	}
}

// eventsStep writes events in order, then a sale.sold_out for each of
// soldOut that has nothing left by then.
func (l *Ledger) eventsStep(now time.Time, events []Event, soldOut []stock.SKU) step {
	rs := newRowset("ittttittttiit")
	ord := int64(0)
	for _, e := range events {
		rs.add(ord, NewID().String(), e.Type, e.SKU.Program.String(), e.SKU.Ticket.String(), int64(partitionOf(e.SKU)),
			e.Subject.String(), e.Order.String(), e.Buyer.String(), e.Cart.String(), e.Quantity, int64(0), e.Trace)
		ord++
	}
	for _, sku := range soldOut {
		rs.add(ord, NewID().String(), EventSaleSoldOut, sku.Program.String(), sku.Ticket.String(), int64(partitionOf(sku)),
			"", "", "", "", int64(0), int64(1), "")
		ord++
	}
	return step{sql: l.sql.takeEvents, args: append([]any{now.UnixMilli()}, rs.args(l.driver)...)}
}

// takeSQL are the take engine's statements, in the driver's dialect: the
// same text but for how each reads its input rows.
type takeSQL struct {
	takeLock, takeSeats, takeUpdate, takeClaims, takeOrders, takeHolds, takeBuyers string
	takeChannels                                                                   string
	takeCodesLock, codesRead, buyersRead, takeEvents                               string
	confirmHolds, confirmUpdate, sellSeats, holdsRead, ordersRead                  string
	lockHolds, lockOrders                                                          string
	requestsRead                                                                   string
}

func newTakeSQL(d string) takeSQL {
	forUpdate := ""
	if d == Postgres {
		forUpdate = " FOR UPDATE OF s"
	}
	rowsAt := func(first int, cols ...string) string { return rowsFrom(d, "w", first, cols...) }
	var q takeSQL
	q.takeLock = `SELECT s.program, s.ticket, s.total, s.sold, s.held, s.version, s.gate_epoch, s.ended_at, s.seated
		FROM skus s JOIN ` + rowsAt(1, "program text", "ticket text") + ` ON s.program = w.program AND s.ticket = w.ticket
		ORDER BY s.program, s.ticket` + forUpdate
	q.takeSeats = `UPDATE seats SET state = w.state, hold_id = w.owner
		FROM ` + rowsAt(1, "program text", "ticket text", "seat_id text", "owner text", "state text") + `
		WHERE seats.program = w.program AND seats.ticket = w.ticket AND seats.seat_id = w.seat_id AND seats.state = 'free'
		RETURNING seats.program, seats.ticket, seats.seat_id`
	// The rows are locked in (program, ticket) order first (takeLock,
	// before this), as every batch that changes several SKU rows locks
	// them, so no two wait on each other in a cycle. (One statement with a
	// sorted FOR UPDATE in a CTE costs PostgreSQL more to plan than the
	// two: 281 against 186 us a batch.)
	q.takeUpdate = `UPDATE skus SET sold = skus.sold + w.sold, held = skus.held + w.held, version = skus.version + 1,
			updated_at = $1, bypass_seq = skus.bypass_seq + w.bypass
		FROM ` + rowsAt(2, "program text", "ticket text", "sold bigint", "held bigint", "epoch bigint", "counted bigint", "bypass bigint") + `
		WHERE skus.program = w.program AND skus.ticket = w.ticket AND skus.ended_at = 0
			AND skus.sold + skus.held + w.sold + w.held <= skus.total AND (w.counted = 0 OR skus.seated = 0)
			AND (w.epoch = -1 OR skus.gate_epoch = w.epoch)
		RETURNING skus.program, skus.ticket, skus.gate_epoch, skus.per_buyer,
			COALESCE((SELECT p.per_buyer FROM programs p WHERE p.program = skus.program), 0)`
	q.takeClaims = `INSERT INTO requests (scope, idem_key, fingerprint, op, program, ticket, result, sku_version, created_at)
		SELECT w.scope, w.idem_key, w.fingerprint, w.op, w.program, w.ticket, w.result,
			COALESCE((SELECT s.version FROM skus s WHERE s.program = w.program AND s.ticket = w.ticket), 0), $1
		FROM ` + rowsAt(2, "scope text", "idem_key text", "fingerprint text", "op text", "program text", "ticket text", "result text") + `
		WHERE true ON CONFLICT (scope, idem_key) DO NOTHING RETURNING scope, idem_key`
	epochOf := `CASE WHEN w.epoch >= 0 THEN w.epoch ELSE (SELECT s.gate_epoch FROM skus s WHERE s.program = w.program AND s.ticket = w.ticket) END`
	q.takeOrders = `INSERT INTO orders (id, idem_key, request_hash, program, ticket, buyer, quantity, gate, gate_key, hold_id,
			take_epoch, cart_id, code_hash, seat_ids, created_at)
		SELECT w.id, w.idem_key, w.request_hash, w.program, w.ticket, w.buyer, w.quantity, w.gate, w.gate_key, w.hold_id,
			` + epochOf + `, w.cart_id, w.code_hash, w.seat_ids, $1
		FROM ` + rowsAt(2, "id text", "idem_key text", "request_hash text", "program text", "ticket text", "buyer text",
		"quantity bigint", "gate text", "gate_key text", "hold_id text", "epoch bigint", "cart_id text", "code_hash text", "seat_ids text") + `
		WHERE true ON CONFLICT (idem_key) DO NOTHING RETURNING idem_key`
	q.takeChannels = `INSERT INTO order_channels (order_id, channel)
		SELECT w.order_id, w.channel FROM ` + rowsAt(1, "order_id text", "channel text") + `
		WHERE true ON CONFLICT (order_id) DO NOTHING`
	q.takeHolds = `INSERT INTO holds (id, idem_key, request_hash, program, ticket, quantity, buyer, gate, state, expires_at,
			take_epoch, seat_ids, cart_id, code_hash, created_at)
		SELECT w.id, w.idem_key, w.request_hash, w.program, w.ticket, w.quantity, w.buyer, w.gate, 'held', w.expires_at,
			` + epochOf + `, w.seat_ids, w.cart_id, w.code_hash, $1
		FROM ` + rowsAt(2, "id text", "idem_key text", "request_hash text", "program text", "ticket text", "quantity bigint",
		"buyer text", "gate text", "expires_at bigint", "epoch bigint", "seat_ids text", "cart_id text", "code_hash text") + `
		WHERE true ON CONFLICT (idem_key) DO NOTHING RETURNING idem_key`
	// Only rows under a cap are counted: a cap switched on later counts
	// its scope's rows from the holds and orders first (see PutSKU and
	// PutProgram).
	q.takeBuyers = `INSERT INTO buyer_units (program, ticket, buyer, units)
		SELECT w.program, w.ticket, w.buyer, w.units FROM ` + rowsAt(1, "program text", "ticket text", "buyer text", "units bigint") + `
		WHERE ` + capOf("w") + ` > 0 AND w.units <= ` + capOf("w") + `
		ON CONFLICT (program, ticket, buyer) DO UPDATE SET units = buyer_units.units + excluded.units
		WHERE buyer_units.units + excluded.units <= ` + capOf("buyer_units") + `
		RETURNING program, ticket, buyer`
	q.buyersRead = `SELECT w.program, w.ticket, w.buyer, COALESCE(b.units, 0), COALESCE(` + capOf("w") + `, 0)
		FROM ` + rowsAt(1, "program text", "ticket text", "buyer text") + `
		LEFT JOIN buyer_units b ON b.program = w.program AND b.ticket = w.ticket AND b.buyer = w.buyer`
	q.takeCodesLock = `UPDATE access_codes SET max_uses = access_codes.max_uses
		FROM ` + rowsAt(1, "program text", "ticket text", "code_hash text") + `
		WHERE access_codes.program = w.program AND access_codes.ticket = w.ticket AND access_codes.code_hash = w.code_hash`
	q.codesRead = `SELECT c.program, c.ticket, c.code_hash, c.max_uses, c.buyer,
			(SELECT COUNT(DISTINCT CASE WHEN o.gate_key = '' THEN o.idem_key ELSE o.gate_key END) FROM orders o
				WHERE o.code_hash = c.code_hash AND o.code_hash <> '' AND o.program = c.program AND o.ticket = c.ticket AND o.refunded_at = 0)
			+ (SELECT COUNT(*) FROM holds h WHERE h.code_hash = c.code_hash AND h.code_hash <> '' AND h.program = c.program AND h.ticket = c.ticket AND h.state = 'held')
		FROM access_codes c JOIN ` + rowsAt(1, "program text", "ticket text", "code_hash text") + `
			ON c.program = w.program AND c.ticket = w.ticket AND c.code_hash = w.code_hash`
	q.takeEvents = `INSERT INTO events (event_id, type, program, ticket, partition, subject, order_id, buyer, cart_id, quantity, created_at, traceparent)
		SELECT w.event_id, w.type, w.program, w.ticket, w.part, w.subject, w.order_id, w.buyer, w.cart_id, w.quantity, $1, w.traceparent
		FROM ` + rowsAt(2, "ord bigint", "event_id text", "type text", "program text", "ticket text", "part bigint", "subject text",
		"order_id text", "buyer text", "cart_id text", "quantity bigint", "if_empty bigint", "traceparent text") + `
		WHERE w.if_empty = 0 OR (SELECT s.total - s.sold - s.held FROM skus s WHERE s.program = w.program AND s.ticket = w.ticket) = 0
		ORDER BY w.ord`
	// The holds are found by id alone and the state change is decided in
	// the SET: with the conditions in the WHERE, a planner whose statistics
	// lag a burst of new holds (estimated 52 held, found 32,000) scans the
	// (state, expires_at) index and joins every held hold with the batch
	// (20 ms a batch of 40, seen). A hold that is not confirmable is
	// written unchanged and not returned as confirmed.
	live := `holds.state = 'held' AND holds.expires_at > $1 AND holds.buyer = w.buyer AND holds.cart_id = ''`
	q.confirmHolds = `UPDATE holds SET state = CASE WHEN ` + live + ` THEN 'confirmed' ELSE holds.state END,
			ended_at = CASE WHEN ` + live + ` THEN $1 ELSE holds.ended_at END,
			order_id = CASE WHEN ` + live + ` THEN w.order_id ELSE holds.order_id END
		FROM ` + rowsAt(2, "id text", "buyer text", "order_id text") + `
		WHERE holds.id = w.id
		RETURNING holds.id, holds.state, holds.order_id`
	q.confirmUpdate = `UPDATE skus SET held = skus.held - w.q, sold = skus.sold + w.q, version = skus.version + 1, updated_at = $1
		FROM ` + rowsAt(2, "program text", "ticket text", "q bigint") + `
		WHERE skus.program = w.program AND skus.ticket = w.ticket AND skus.held >= w.q
		RETURNING skus.program, skus.ticket`
	// Rows of holds and orders are locked in id order before a batch
	// changes several, as SKU rows are in SKU order.
	forUpdateOf := func(t string) string {
		if d == Postgres {
			return " FOR UPDATE OF " + t
		}
		return ""
	}
	q.requestsRead = `SELECT r.scope, r.idem_key FROM requests r JOIN ` + rowsAt(1, "scope text", "idem_key text") +
		` ON r.scope = w.scope AND r.idem_key = w.idem_key`
	q.lockHolds = `SELECT h.id FROM holds h JOIN ` + rowsAt(1, "id text") + ` ON h.id = w.id ORDER BY h.id` + forUpdateOf("h")
	q.lockOrders = `SELECT o.id FROM orders o JOIN ` + rowsAt(1, "id text") + ` ON o.id = w.id ORDER BY o.id` + forUpdateOf("o")
	q.holdsRead = selectHoldFrom("h") + ` JOIN ` + rowsAt(1, "id text") + ` ON h.id = w.id`
	q.ordersRead = selectOrderFrom("o") + ` JOIN ` + rowsAt(1, "id text") + ` ON o.id = w.id`
	q.sellSeats = `UPDATE seats SET state = 'sold' FROM ` + rowsAt(1, "hold_id text") + `
		WHERE seats.state = 'held' AND seats.hold_id = w.hold_id`
	return q
}
