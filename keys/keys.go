// Package keys builds every Redis key stockgate uses. Nothing else in the
// module formats a key string, so the hash-slot rules live in one file:
//
//   - every key one Lua call touches carries the same hash tag, so the call
//     never crosses slots;
//   - shard i of a SKU gets its own tag, chosen so that the shards of one SKU
//     spread evenly over the slot space and therefore over the masters;
//   - every id that goes into a key is an ID, which only ParseID makes, from
//     text matching [A-Za-z0-9_-]{1,64}: user data can never contain a brace
//     and move a key, and nothing past the edge checks an id twice.
//
// The package imports nothing of the module's and nothing third-party.
package keys

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// ErrInvalidID reports an id that may not be used in a key.
var ErrInvalidID = errors.New("keys: invalid id")

// MaxIDLen is the longest id accepted.
const MaxIDLen = 64

// Slots is the number of hash slots in a Redis Cluster.
const Slots = 16384

// CheckID returns ErrInvalidID unless id matches [A-Za-z0-9_-]{1,64}.
// It is hand-written rather than a regexp because it runs on every request.
func CheckID(id string) error {
	if len(id) == 0 || len(id) > MaxIDLen {
		return fmt.Errorf("%w: length %d not in 1..%d", ErrInvalidID, len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return fmt.Errorf("%w: byte %d is %q", ErrInvalidID, i, c)
		}
	}
	return nil
}

// ID is an id that may go into a key: text matching [A-Za-z0-9_-]{1,64}.
// Only ParseID (and MustID, for ids the program spells itself) makes a
// non-zero one, so a value of this type has been checked, once, at the
// edge. The zero ID is "no id" and no key function accepts it.
type ID struct{ s string }

// ParseID checks text and returns it as an ID.
func ParseID(text string) (ID, error) {
	if err := CheckID(text); err != nil {
		return ID{}, err
	}
	return ID{text}, nil
}

// MustID is ParseID for ids written in the program (a lock's purpose, the
// hex of a hash, tests); it panics on bad text, which there is a bug.
func MustID(text string) ID {
	id, err := ParseID(text)
	if err != nil {
		panic(fmt.Sprintf("keys.MustID(%q): %v", text, err))
	}
	return id
}

// String is the id's text ("" for the zero ID).
func (id ID) String() string { return id.s }

// IsZero reports whether id is the zero ID (no id).
func (id ID) IsZero() bool { return id.s == "" }

// Compare orders ids by their text, for locking rows in one global order.
func (id ID) Compare(other ID) int { return strings.Compare(id.s, other.s) }

// Join writes ids' text separated by sep (seat lists in records).
func Join(ids []ID, sep string) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(id.s)
	}
	return b.String()
}

// MarshalText writes the id's text, so an ID encodes as a JSON string.
func (id ID) MarshalText() ([]byte, error) { return []byte(id.s), nil }

// MarshalBinary writes the id's text, so go-redis sends an ID given as a
// script argument as that text.
func (id ID) MarshalBinary() ([]byte, error) { return []byte(id.s), nil }

// poolSep joins a ticket id and a pool name into the id of the pool's
// stock (Pooled). No id ParseID accepts contains it, so a client can never
// name a pool's stock, or anything else the service derives, as a ticket.
const poolSep = "."

// Pooled is the ticket id of pool's stock of ticket: ticket itself for the
// zero pool (the public one). The result is made here only, never parsed
// from a client.
func Pooled(ticket, pool ID) ID {
	mustHave("Pooled", ticket)
	if pool.IsZero() {
		return ticket
	}
	if strings.Contains(ticket.s, poolSep) || strings.Contains(pool.s, poolSep) {
		panic(fmt.Sprintf("keys.Pooled(%q, %q): already pooled", ticket.s, pool.s))
	}
	return ID{ticket.s + poolSep + pool.s}
}

// CodeScope is the ticket id under which a pool's access code uses are
// counted at the gate (as buyers' units are under a ticket's): two
// separators, so neither a client's ticket nor a pool's stock has it. It
// names Redis counts only, never a stored row.
func CodeScope(ticket ID) ID {
	mustHave("CodeScope", ticket)
	return ID{ticket.s + poolSep + poolSep + "codes"}
}

// Unpooled splits a ticket id made by Pooled into the ticket and the pool
// (zero for a ticket's own, public, stock).
func (id ID) Unpooled() (ticket, pool ID) {
	t, p, ok := strings.Cut(id.s, poolSep)
	if !ok {
		return id, ID{}
	}
	return ID{t}, ID{p}
}

// Derived is the id of a record the service makes for id on its own
// behalf (purpose names which: a late payment's request for a hold, say):
// purpose and id joined by the separator no client id has, so a client's
// Idempotency-Key can never take it. It is stored (ParseStored reads it
// back) and never goes into a Redis key as it is.
func Derived(purpose string, id ID) ID {
	mustHave("Derived", id)
	if err := CheckID(purpose); err != nil || strings.Contains(id.s, poolSep) {
		panic(fmt.Sprintf("keys.Derived(%q, %q): not two plain ids", purpose, id.s))
	}
	return ID{purpose + poolSep + id.s}
}

// ParseStored parses an id the service stored or sent itself (a ledger
// row, a record, a notice from another replica): what ParseID accepts, or
// a Pooled id of two such parts.
func ParseStored(text string) (ID, error) {
	t, p, ok := strings.Cut(text, poolSep)
	if !ok {
		return ParseID(text)
	}
	if err := CheckID(t); err != nil {
		return ID{}, err
	}
	if err := CheckID(p); err != nil {
		return ID{}, err
	}
	return ID{text}, nil
}

// UnmarshalText parses text as a stored ID (ParseStored): "" gives the
// zero ID. Client input is parsed with ParseID at the edge, never by this.
func (id *ID) UnmarshalText(text []byte) error {
	if len(text) == 0 {
		*id = ID{}
		return nil
	}
	v, err := ParseStored(string(text))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// Value writes the id to SQL as its text (NULL-free: the zero ID is "").
func (id ID) Value() (driver.Value, error) { return id.s, nil }

// Scan reads an id back from SQL and checks it again, so a corrupt or
// hand-edited row can never put a brace into a key.
func (id *ID) Scan(src any) error {
	switch v := src.(type) {
	case string:
		return id.UnmarshalText([]byte(v))
	case []byte:
		return id.UnmarshalText(v)
	case nil:
		*id = ID{}
		return nil
	}
	return fmt.Errorf("%w: cannot scan %T", ErrInvalidID, src)
}

// ShardKeys names the keys of one shard of one SKU. Every key it returns
// shares the shard's hash tag.
type ShardKeys struct {
	tag  string // "{xyz}" with braces
	base string // program:ticket:n:i
	slot int
}

// Shard returns the keys of shard i of n of the SKU (program, ticket). It
// panics on a missing id or 0 <= i < n not holding: a caller that gets here
// with those has a bug, not bad input.
func Shard(program, ticket ID, i, n int) ShardKeys {
	if program.IsZero() || ticket.IsZero() || n < 1 || i < 0 || i >= n {
		panic(fmt.Sprintf("keys.Shard(%q, %q, %d, %d): missing arguments", program.s, ticket.s, i, n))
	}
	slot := ShardSlot(program, ticket, i, n)
	return ShardKeys{
		tag:  "{" + slotTags()[slot] + "}",
		base: program.s + ":" + ticket.s + ":" + strconv.Itoa(n) + ":" + strconv.Itoa(i),
		slot: slot,
	}
}

// ShardSlot is the hash slot of shard i of n of a SKU. The SKU's shards sit
// at a fixed stride of Slots/n from a base slot hashed from the SKU, so any
// contiguous range of slots (a master's share) holds a proportional count of
// them. The base is kept at 2 mod 4: with the standard split of slots over 3
// masters, that keeps a shard off the exact boundary slots, where rounding of
// the stride would otherwise give one master an extra shard for n = 3, 6, 12.
func ShardSlot(program, ticket ID, i, n int) int {
	return spread(int(CRC16([]byte(program.s+":"+ticket.s))%(Slots/4))*4+2, i, n)
}

func spread(base, i, n int) int { return (base + i*Slots/n) % Slots }

// Slot is the hash slot of every key of the shard.
func (s ShardKeys) Slot() int { return s.slot }

// Stock is the shard's hash: fields "avail" (units left) and "allot" (the
// most the shard may ever hold; restores are capped at it).
func (s ShardKeys) Stock() string { return "sg:" + s.tag + ":stock:" + s.base }

// Deduction is the record of one request's deduction from this shard: it
// makes a re-sent deduct a no-op and lets a restore happen once.
func (s ShardKeys) Deduction(requestID ID) string {
	mustHave("ShardKeys.Deduction", requestID)
	return "sg:" + s.tag + ":ded:" + s.base + ":" + requestID.s
}

// Refill is the record that a return of stock the ledger took back
// (returnID, derived by the service from the hold or order) was added to
// this shard, so it is added once.
func (s ShardKeys) Refill(returnID ID) string {
	mustHave("ShardKeys.Refill", returnID)
	return "sg:" + s.tag + ":refill:" + s.base + ":" + returnID.s
}

// mustHave panics on a missing id: every caller passes one it parsed.
func mustHave(fn string, ids ...ID) {
	for _, id := range ids {
		if id.IsZero() {
			panic("keys." + fn + ": missing id")
		}
	}
}

// Lock is the key of a coordination lock named purpose for one SKU (for
// example "reseed"). It is hashed like the SKU's shard 0, so each SKU's lock
// lives on a master chosen by the SKU.
func Lock(program, ticket, purpose ID) string {
	mustHave("Lock", purpose)
	s := Shard(program, ticket, 0, 1)
	return "sg:" + s.tag + ":lock:" + purpose.s + ":" + program.s + ":" + ticket.s
}

// RequestLock is the key of a lock named purpose for one request (id)
// about a SKU: hashed like the SKU's shard 0, as Lock is, so the lock
// lives on a master the request needs anyway (a cart's lock hashed by the
// request alone sent a third of the carts around their gates, healthy
// SKUs' too, while one master was down).
func RequestLock(program, ticket, purpose, id ID) string {
	mustHave("RequestLock", purpose, id)
	return Lock(program, ticket, purpose) + ":" + id.s
}

// Quota is the key of what one buyer holds + owns of one SKU at the gate,
// for the per-buyer cap; with the zero ticket it counts the whole program.
// It is hashed by SKU and buyer together, so one buyer's flood lands on one
// master and different buyers spread out.
func Quota(program, ticket, buyer ID) string {
	mustHave("Quota", program, buyer)
	k := program.s + ":" + ticket.s + ":" + buyer.s
	slot := int(CRC16([]byte(k))) % Slots
	return "sg:{" + slotTags()[slot] + "}:quota:" + k
}

// HoldBudget is the pair of keys (entries by expiry, and their units) of
// what one identity holds at once across a program, for the program's hold
// budget: kind "b" for a buyer, "d" for a device or payment fingerprint
// (identity its digest). Both are hashed by program, kind and identity
// into one slot, so one script reads and writes them together.
func HoldBudget(program ID, kind, identity string) (entries, units string) {
	mustHave("HoldBudget", program)
	if identity == "" || (kind != "b" && kind != "d") {
		panic("keys.HoldBudget: missing identity or kind")
	}
	k := program.s + ":" + kind + ":" + identity
	slot := int(CRC16([]byte(k))) % Slots
	base := "sg:{" + slotTags()[slot] + "}:budget:" + k
	return base + ":entries", base + ":units"
}

// Seats is the key of one section of a SKU's seat map: a hash of seat id
// to state, so a hold of several seats of one section is one script on one
// slot. The section's tag is hashed from the SKU and the section, so the
// sections of a hot map spread over the masters.
func Seats(program, ticket, section ID) string {
	mustHave("Seats", program, ticket, section)
	k := program.s + ":" + ticket.s + ":" + section.s
	slot := int(CRC16([]byte(k))) % Slots
	return "sg:{" + slotTags()[slot] + "}:seats:" + k
}

// SeatLayout is the key of a section's layout (seat id → "row|number"), in
// the same slot as its Seats key, for best-available selection.
func SeatLayout(program, ticket, section ID) string {
	k := Seats(program, ticket, section)
	end := strings.IndexByte(k, '}')
	return k[:end+1] + ":seatlayout:" + program.s + ":" + ticket.s + ":" + section.s
}

// Bench is the key of a benchmark comparator's stock counter or lock for
// a SKU (kind names which). Only the benchmark harness uses it; it keeps
// the rule that key strings are built here.
func Bench(program, ticket, kind ID) string {
	mustHave("Bench", kind)
	s := Shard(program, ticket, 0, 1)
	return "sg:" + s.tag + ":bench:" + kind.s + ":" + program.s + ":" + ticket.s
}

// EventStream is the Redis stream of an outbox partition: prefix (the
// operator's, with no brace in it) and the partition as the hash tag, so
// the partitions' streams spread over the masters.
func EventStream(prefix string, partition int) string {
	return prefix + "{" + fmt.Sprintf("%02d", partition) + "}"
}

// EventSeen marks an event as added to its partition's stream, in the
// stream's slot.
func EventSeen(prefix string, partition int, event ID) string {
	mustHave("EventSeen", event)
	return EventStream(prefix, partition) + ":seen:" + event.s
}

// QueueKeys are the Redis records of a program's waiting room, all in one
// slot (the program's queue tag).
type QueueKeys struct{ tag string }

// Queue returns the keys of program's waiting room.
func Queue(program ID) QueueKeys {
	mustHave("Queue", program)
	return QueueKeys{tag: "sg:{q:" + program.s + "}:"}
}

// Meta is the hash of the line's counters: line (set while the record
// exists), pre and post (joins before and after opening) and their caps
// (precap, postcap: the places the ledger reserved), frozen (the pre count
// at opening), serving, soldout, unused, abandoned, old (the last position
// admitted before the window), gaplo and gaphi (places a restore could not
// tell given or not).
func (q QueueKeys) Meta() string { return q.tag + "meta" }

// Who maps each buyer to its join ("kind:n").
func (q QueueKeys) Who() string { return q.tag + "who" }

// Batches holds each advance of the serving counter: by time (score) and
// by position (BatchesByEnd), to find when a position was admitted.
func (q QueueKeys) Batches() string { return q.tag + "batches" }

// BatchesByEnd is Batches scored by the end position.
func (q QueueKeys) BatchesByEnd() string { return q.tag + "bend" }

// Spent is the set of buyers whose admission was spent, scored by the
// position they were admitted at.
func (q QueueKeys) Spent() string { return q.tag + "spent" }

// Claims maps a buyer whose admission was spent to the request that spent
// it.
func (q QueueKeys) Claims() string { return q.tag + "claims" }

// Flights counts, per buyer, the copies of the request that spent its
// admission still in flight, and marks the one that committed.
func (q QueueKeys) Flights() string { return q.tag + "flights" }

// Pending is the part of Spent whose request has not committed yet: the
// pacer counts those buyers as admitted-but-unused, since the ledger
// still counts their tickets as left.
func (q QueueKeys) Pending() string { return q.tag + "pending" }

// CRC16 is the CCITT/XMODEM checksum Redis Cluster hashes keys with.
func CRC16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^c]
	}
	return crc
}

// KeySlot is the hash slot Redis Cluster assigns to key, honouring the first
// non-empty {hash tag} as the server does.
func KeySlot(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					return int(CRC16([]byte(key)) % Slots)
				}
			}
			break
		}
	}
	return int(CRC16([]byte(key)) % Slots)
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// slotTags maps each slot to the shortest tag (base-62 digits) that hashes to
// it. It is computed once, on first use, in a few milliseconds, and never
// changes, so every gateway replica derives the same keys.
var slotTags = sync.OnceValue(func() *[Slots]string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	var tags [Slots]string
	left := Slots
	buf := make([]byte, 0, 8)
	for n := 0; left > 0; n++ {
		buf = buf[:0]
		for v := n; ; v /= len(digits) {
			buf = append(buf, digits[v%len(digits)])
			if v < len(digits) {
				break
			}
		}
		slot := CRC16(buf) % Slots
		if tags[slot] == "" {
			tags[slot] = string(buf)
			left--
		}
	}
	return &tags
})
