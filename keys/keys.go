// Package keys builds every Redis key stockgate uses. Nothing else in the
// module formats a key string, so the hash-slot rules live in one file:
//
//   - every key one Lua call touches carries the same hash tag, so the call
//     never crosses slots;
//   - shard i of a SKU gets its own tag, chosen so that the shards of one SKU
//     spread evenly over the slot space and therefore over the masters;
//   - every id that goes into a key is checked against [A-Za-z0-9_-]{1,64}
//     first, so user data can never contain a brace and move a key.
//
// The package imports nothing of the module's and nothing third-party.
package keys

import (
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

// ShardKeys names the keys of one shard of one SKU. Every key it returns
// shares the shard's hash tag.
type ShardKeys struct {
	tag  string // "{xyz}" with braces
	base string // program:ticket:n:i
	slot int
}

// Shard returns the keys of shard i of n of the SKU (program, ticket). The ids
// must already have passed CheckID and 0 <= i < n; Shard panics otherwise,
// because a caller that gets here with bad ids has a bug, not bad input.
func Shard(program, ticket string, i, n int) ShardKeys {
	if CheckID(program) != nil || CheckID(ticket) != nil || n < 1 || i < 0 || i >= n {
		panic(fmt.Sprintf("keys.Shard(%q, %q, %d, %d): unchecked arguments", program, ticket, i, n))
	}
	slot := ShardSlot(program, ticket, i, n)
	return ShardKeys{
		tag:  "{" + slotTags()[slot] + "}",
		base: program + ":" + ticket + ":" + strconv.Itoa(n) + ":" + strconv.Itoa(i),
		slot: slot,
	}
}

// ShardSlot is the hash slot of shard i of n of a SKU. The SKU's shards sit
// at a fixed stride of Slots/n from a base slot hashed from the SKU, so any
// contiguous range of slots (a master's share) holds a proportional count of
// them. The base is kept at 2 mod 4: with the standard split of slots over 3
// masters, that keeps a shard off the exact boundary slots, where rounding of
// the stride would otherwise give one master an extra shard for n = 3, 6, 12.
func ShardSlot(program, ticket string, i, n int) int {
	return spread(int(CRC16([]byte(program+":"+ticket))%(Slots/4))*4+2, i, n)
}

func spread(base, i, n int) int { return (base + i*Slots/n) % Slots }

// Slot is the hash slot of every key of the shard.
func (s ShardKeys) Slot() int { return s.slot }

// Stock is the shard's hash: fields "avail" (units left) and "allot" (the
// most the shard may ever hold; restores are capped at it).
func (s ShardKeys) Stock() string { return "sg:" + s.tag + ":stock:" + s.base }

// Deduction is the record of one request's deduction from this shard: it
// makes a re-sent deduct a no-op and lets a restore happen once.
func (s ShardKeys) Deduction(requestID string) string {
	return "sg:" + s.tag + ":ded:" + s.base + ":" + requestID
}

// Refill is the record that a return of stock the ledger took back
// (returnID, derived by the service from the hold or order) was added to
// this shard, so it is added once.
func (s ShardKeys) Refill(returnID string) string {
	return "sg:" + s.tag + ":refill:" + s.base + ":" + returnID
}

// Lock is the key of a coordination lock named purpose for one SKU (for
// example "reseed"). It is hashed like the SKU's shard 0, so each SKU's lock
// lives on a master chosen by the SKU. The ids must have passed CheckID.
func Lock(program, ticket, purpose string) string {
	if CheckID(purpose) != nil {
		panic(fmt.Sprintf("keys.Lock: unchecked purpose %q", purpose))
	}
	s := Shard(program, ticket, 0, 1)
	return "sg:" + s.tag + ":lock:" + purpose + ":" + program + ":" + ticket
}

// Quota is the key of what one buyer holds + owns of one SKU at the gate,
// for the per-buyer cap; with ticket "" it counts the whole program. It is
// hashed by SKU and buyer together, so one buyer's flood lands on one
// master and different buyers spread out. The ids must have passed CheckID.
func Quota(program, ticket, buyer string) string {
	if CheckID(program) != nil || (ticket != "" && CheckID(ticket) != nil) || CheckID(buyer) != nil {
		panic(fmt.Sprintf("keys.Quota(%q, %q, %q): unchecked ids", program, ticket, buyer))
	}
	slot := int(CRC16([]byte(program+":"+ticket+":"+buyer))) % Slots
	return "sg:{" + slotTags()[slot] + "}:quota:" + program + ":" + ticket + ":" + buyer
}

// Seats is the key of one section of a SKU's seat map: a hash of seat id
// to state, so a hold of several seats of one section is one script on one
// slot. The section's tag is hashed from the SKU and the section, so the
// sections of a hot map spread over the masters. Ids must have passed
// CheckID.
func Seats(program, ticket, section string) string {
	if CheckID(program) != nil || CheckID(ticket) != nil || CheckID(section) != nil {
		panic(fmt.Sprintf("keys.Seats(%q, %q, %q): unchecked ids", program, ticket, section))
	}
	slot := int(CRC16([]byte(program+":"+ticket+":"+section))) % Slots
	return "sg:{" + slotTags()[slot] + "}:seats:" + program + ":" + ticket + ":" + section
}

// SeatLayout is the key of a section's layout (seat id → "row|number"), in
// the same slot as its Seats key, for best-available selection.
func SeatLayout(program, ticket, section string) string {
	k := Seats(program, ticket, section)
	end := strings.IndexByte(k, '}')
	return k[:end+1] + ":seatlayout:" + program + ":" + ticket + ":" + section
}

// Bench is the key of a benchmark comparator's stock counter or lock for
// a SKU (kind names which). Only the benchmark harness uses it; it keeps
// the rule that key strings are built here.
func Bench(program, ticket, kind string) string {
	if CheckID(kind) != nil {
		panic(fmt.Sprintf("keys.Bench: unchecked kind %q", kind))
	}
	s := Shard(program, ticket, 0, 1)
	return "sg:" + s.tag + ":bench:" + kind + ":" + program + ":" + ticket
}

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
