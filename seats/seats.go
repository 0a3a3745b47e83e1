// Package seats runs reserved seating on Redis Cluster: each section of a
// SKU's seat map is one hash (seat id → state), so holding several seats of
// a section is one all-or-nothing script on one slot. The ledger is the
// truth; this is the gate that turns away requests for taken seats, and
// Repair rewrites it from the ledger's facts.
//
// A seat's state in Redis is "" (free), a hold id (held by that hold), or
// "S:" + hold id (sold through that hold).
package seats

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/lua"
	"github.com/stockgate/stockgate/stock"
)

// Errors.
var (
	// ErrTaken: some of the seats are held or sold by others; Taken lists them.
	ErrTaken = errors.New("seats: taken")
	// ErrUnknownSeat: some seats are not in the section's map.
	ErrUnknownSeat = errors.New("seats: not in the seat map")
)

// Seat is one seat of a map.
type Seat struct {
	ID      keys.ID `json:"id"`
	Section keys.ID `json:"section"`
	Row     string  `json:"row"`
	Number  int     `json:"number"`
}

// Validate checks what a seat's ids (parsed at the edge) do not: that they
// are there, and its row and number.
func (s Seat) Validate() error {
	if s.ID.IsZero() || s.Section.IsZero() {
		return fmt.Errorf("%w: seat %q section %q: missing id", stock.ErrInvalid, s.ID, s.Section)
	}
	if s.Row == "" || len(s.Row) > MaxRowLen || !printable(s.Row) || s.Number < 1 || s.Number > MaxSeatNumber {
		return fmt.Errorf("%w: seat %q row %q number %d (a row of 1 to %d printable bytes, a number in 1..%d)",
			stock.ErrInvalid, s.ID, s.Row, s.Number, MaxRowLen, MaxSeatNumber)
	}
	return nil
}

// The bounds of a seat's row and number: what every ledger stores (the
// number is a 32-bit INTEGER in PostgreSQL, whose text holds no NUL), so a
// map the ledger can't keep is the admin's 422, not the ledger's 503.
const (
	MaxRowLen     = 16
	MaxSeatNumber = math.MaxInt32
)

// printable: valid UTF-8 with no control characters (NUL among them).
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// SeatError names the seats a hold could not have.
type SeatError struct {
	Err   error // ErrTaken or ErrUnknownSeat
	Seats []string
}

func (e *SeatError) Error() string { return fmt.Sprintf("%v: %v", e.Err, e.Seats) }
func (e *SeatError) Unwrap() error { return e.Err }

// Store is the Redis side of seat maps.
type Store struct {
	rdb  redis.Scripter
	hold *redis.Script
	set  *redis.Script
	best *redis.Script
}

// New returns a Store on rdb (a *redis.ClusterClient in production).
func New(rdb redis.Scripter) (*Store, error) {
	if rdb == nil {
		return nil, errors.New("seats: a Redis client is required")
	}
	return &Store{rdb: rdb, hold: redis.NewScript(lua.SeatsHold), set: redis.NewScript(lua.SeatsSet),
		best: redis.NewScript(lua.SeatsBest)}, nil
}

// State values.
const free = ""

func sold(hold string) string { return "S:" + hold }

// Load adds the seats of a map that Redis does not have yet, free; seats it
// has keep their state. Seats are grouped by section.
func (s *Store) Load(ctx context.Context, sku stock.SKU, seats []Seat) error {
	for section, ids := range bySection(seats) {
		if err := s.move(ctx, sku, section, "-", free, ids); err != nil {
			return err
		}
	}
	// The layout, for best-available: seat id → "row|number".
	rdb, ok := s.rdb.(redis.Cmdable)
	if !ok {
		return errors.New("seats: load needs a full client")
	}
	layout := map[keys.ID][]any{}
	for _, st := range seats {
		layout[st.Section] = append(layout[st.Section], st.ID, fmt.Sprintf("%s|%d", st.Row, st.Number))
	}
	for section, args := range layout {
		if err := rdb.HSet(ctx, keys.SeatLayout(sku.Program, sku.Ticket, section), args...).Err(); err != nil {
			return fmt.Errorf("seats: layout: %w", err)
		}
	}
	return nil
}

// ErrNoAdjacent: no q adjacent free seats in the section.
var ErrNoAdjacent = errors.New("seats: no adjacent seats free")

// Best holds the best q adjacent free seats of one section for holdID (same
// row, consecutive, front-most, avoiding a stranded single seat) and returns
// them; a retry with the same hold id returns the seats it already holds.
func (s *Store) Best(ctx context.Context, sku stock.SKU, section, holdID keys.ID, q int) ([]keys.ID, error) {
	if err := checkIDs(sku, section, holdID, nil, false); err != nil {
		return nil, err
	}
	if q < 1 || q > 64 {
		return nil, fmt.Errorf("%w: %d seats", stock.ErrInvalid, q)
	}
	v, err := s.best.Run(ctx, s.rdb, []string{keys.Seats(sku.Program, sku.Ticket, section),
		keys.SeatLayout(sku.Program, sku.Ticket, section)}, holdID, q).Slice()
	if err != nil {
		return nil, fmt.Errorf("seats: best: %w", err)
	}
	switch code, _ := v[0].(int64); code {
	case lua.SeatsHeld, lua.SeatsAgain:
		return parseIDs(strs(v[1:]))
	case lua.SeatsTaken:
		return nil, ErrNoAdjacent
	}
	return nil, fmt.Errorf("seats: best: unexpected reply %v", v)
}

func bySection(seats []Seat) map[keys.ID][]keys.ID {
	out := map[keys.ID][]keys.ID{}
	for _, st := range seats {
		out[st.Section] = append(out[st.Section], st.ID)
	}
	return out
}

// Hold holds the given seats of one section for holdID, all or nothing. A
// retry with the same hold id succeeds again without change. It returns a
// *SeatError (ErrTaken, ErrUnknownSeat) naming the seats that stopped it.
func (s *Store) Hold(ctx context.Context, sku stock.SKU, section, holdID keys.ID, ids []keys.ID) error {
	if err := checkIDs(sku, section, holdID, ids, true); err != nil {
		return err
	}
	args := append([]any{holdID}, anys(ids)...)
	v, err := s.hold.Run(ctx, s.rdb, []string{keys.Seats(sku.Program, sku.Ticket, section)}, args...).Slice()
	if err != nil {
		return fmt.Errorf("seats: hold: %w", err)
	}
	code, _ := v[0].(int64)
	switch code {
	case lua.SeatsHeld:
		return nil
	case lua.SeatsTaken:
		return &SeatError{Err: ErrTaken, Seats: strs(v[1:])}
	case lua.SeatsUnknown:
		return &SeatError{Err: ErrUnknownSeat, Seats: strs(v[1:])}
	}
	return fmt.Errorf("seats: hold: unexpected reply %v", v)
}

// Release frees the seats holdID holds; seats held by any other hold, or
// sold, are left alone (release is owner-checked by hold id). It returns
// how many seats it freed.
func (s *Store) Release(ctx context.Context, sku stock.SKU, section, holdID keys.ID, ids []keys.ID) (int, error) {
	if err := checkIDs(sku, section, holdID, ids, true); err != nil {
		return 0, err
	}
	return s.count(ctx, sku, section, holdID.String(), free, ids)
}

// ReleaseSold frees the seats sold through holdID (a refund).
func (s *Store) ReleaseSold(ctx context.Context, sku stock.SKU, section, holdID keys.ID, ids []keys.ID) (int, error) {
	if err := checkIDs(sku, section, holdID, ids, true); err != nil {
		return 0, err
	}
	return s.count(ctx, sku, section, sold(holdID.String()), free, ids)
}

// Sell marks the seats holdID holds as sold through it (a confirm).
func (s *Store) Sell(ctx context.Context, sku stock.SKU, section, holdID keys.ID, ids []keys.ID) (int, error) {
	if err := checkIDs(sku, section, holdID, ids, true); err != nil {
		return 0, err
	}
	return s.count(ctx, sku, section, holdID.String(), sold(holdID.String()), ids)
}

func (s *Store) count(ctx context.Context, sku stock.SKU, section keys.ID, from, to string, ids []keys.ID) (int, error) {
	args := append([]any{from, to}, anys(ids)...)
	v, err := s.set.Run(ctx, s.rdb, []string{keys.Seats(sku.Program, sku.Ticket, section)}, args...).Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("seats: set: %w", err)
	}
	if len(v) != 2 || v[0] != lua.OK {
		return 0, fmt.Errorf("seats: set: unexpected script reply %v", v)
	}
	return int(v[1]), nil
}

func (s *Store) move(ctx context.Context, sku stock.SKU, section keys.ID, from, to string, ids []keys.ID) error {
	_, err := s.count(ctx, sku, section, from, to, ids)
	return err
}

// State of one seat: Free, or the hold that holds it, or sold.
type State struct {
	Known bool   // the seat is in Redis's map
	Hold  string // the hold holding it or sold through, "" when free
	Sold  bool
}

// Status reads seats of one section.
func (s *Store) Status(ctx context.Context, sku stock.SKU, section keys.ID, ids []keys.ID) ([]State, error) {
	if err := checkIDs(sku, section, keys.ID{}, ids, false); err != nil {
		return nil, err
	}
	rdb, ok := s.rdb.(redis.Cmdable)
	if !ok {
		return nil, errors.New("seats: status needs a full client")
	}
	fields := make([]string, len(ids))
	for i, id := range ids {
		fields[i] = id.String()
	}
	v, err := rdb.HMGet(ctx, keys.Seats(sku.Program, sku.Ticket, section), fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("seats: status: %w", err)
	}
	out := make([]State, len(ids))
	for i, x := range v {
		str, ok := x.(string)
		if !ok {
			continue
		}
		out[i].Known = true
		if len(str) > 2 && str[:2] == "S:" {
			out[i].Hold, out[i].Sold = str[2:], true
		} else {
			out[i].Hold = str
		}
	}
	return out, nil
}

// checkIDs refuses missing ids (they were parsed at the edge, so a missing
// one is a caller's bug) and a seat named twice. With needHold, a hold id
// is required; ids may be empty only for a pick (Best) or a read.
func checkIDs(sku stock.SKU, section, hold keys.ID, ids []keys.ID, needHold bool) error {
	if sku.Program.IsZero() || sku.Ticket.IsZero() || section.IsZero() || (needHold && hold.IsZero()) {
		return fmt.Errorf("%w: missing sku, section or hold", stock.ErrInvalid)
	}
	if (needHold && len(ids) == 0) || len(ids) > stock.MaxPerOrderCap {
		return fmt.Errorf("%w: %d seats", stock.ErrInvalid, len(ids))
	}
	seen := make(map[keys.ID]bool, len(ids))
	for _, id := range ids {
		if id.IsZero() || seen[id] {
			return fmt.Errorf("%w: seat %q missing or repeated", stock.ErrInvalid, id)
		}
		seen[id] = true
	}
	return nil
}

func anys(ids []keys.ID) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}

// parseIDs reads seat ids back from a script's reply.
func parseIDs(ss []string) ([]keys.ID, error) {
	out := make([]keys.ID, len(ss))
	for i, s := range ss {
		id, err := keys.ParseID(s)
		if err != nil {
			return nil, fmt.Errorf("seats: reply: %w", err)
		}
		out[i] = id
	}
	return out, nil
}

func strs(vs []any) []string {
	var out []string
	for _, v := range vs {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// Gate is a seat's state as the gate stores it: "" free, the hold's key
// (held), "S:" + key (sold).
func Gate(state, holdKey string) string {
	switch state {
	case "held":
		return holdKey
	case "sold":
		return sold(holdKey)
	}
	return free
}

// Raw reads the gate's value of seats of one section ("" free, a key, or
// "S:" key); absent seats read as "-". A section of any size is read, a
// request's worth of seats at a time.
func (s *Store) Raw(ctx context.Context, sku stock.SKU, section keys.ID, ids []keys.ID) ([]string, error) {
	out := make([]string, 0, len(ids))
	for chunk := range slices.Chunk(ids, stock.MaxPerOrderCap) {
		st, err := s.Status(ctx, sku, section, chunk)
		if err != nil {
			return nil, err
		}
		for _, x := range st {
			switch {
			case !x.Known:
				out = append(out, "-")
			case x.Sold:
				out = append(out, sold(x.Hold))
			default:
				out = append(out, x.Hold)
			}
		}
	}
	return out, nil
}

// Repair writes seats' gate values (seat id → value) as they are: the
// consistency check's fix, from the ledger's facts.
func (s *Store) Repair(ctx context.Context, sku stock.SKU, section keys.ID, values map[keys.ID]string) error {
	if len(values) == 0 {
		return nil
	}
	rdb, ok := s.rdb.(redis.Cmdable)
	if !ok {
		return errors.New("seats: repair needs a full client")
	}
	args := make([]any, 0, 2*len(values))
	for id, v := range values {
		args = append(args, id.String(), v)
	}
	return rdb.HSet(ctx, keys.Seats(sku.Program, sku.Ticket, section), args...).Err()
}
