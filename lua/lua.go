// Package lua embeds the Redis scripts stockgate runs, one operation per
// file. Each file opens with its KEYS/ARGV contract and its integer return
// codes; the Go side that calls a script lives in package shard.
//
// Every script touches only keys that share one hash tag (package keys makes
// sure of that), and every script re-checks its numeric arguments, so a bug
// in a caller cannot move stock by a fraction, a negative or a huge amount.
package lua

import _ "embed"

// Seed sets a shard's allotment and available stock.
//
//go:embed seed.lua
var Seed string

// Deduct takes stock from a shard, once per request id.
//
//go:embed deduct.lua
var Deduct string

// Restore gives a deduction back, once, capped at the shard's allotment.
//
//go:embed restore.lua
var Restore string

// Refill adds units the ledger took back to a shard, once per return, at
// the return's gate epoch only.
//
//go:embed refill.lua
var Refill string

// Fence closes or reopens a shard to deductions during a re-seed.
//
//go:embed fence.lua
var Fence string

// Read returns a shard's available stock, allotment, epoch and fence.
//
//go:embed read.lua
var Read string

// Unlock releases a coordination lock by compare-and-delete.
//
//go:embed unlock.lua
var Unlock string

// Renew extends a coordination lock by compare-and-expire.
//
//go:embed renew.lua
var Renew string

// Quota counts a request against a buyer's per-SKU cap, once.
//
//go:embed quota.lua
var Quota string

// Unquota releases a request's count, once.
//
//go:embed unquota.lua
var Unquota string

// SeatsHold holds seats of one section, all or nothing.
//
//go:embed seats_hold.lua
var SeatsHold string

// SeatsBest holds the best q adjacent free seats of a section.
//
//go:embed seats_best.lua
var SeatsBest string

// SeatsSet moves seats between states where they are in the expected one.
//
//go:embed seats_set.lua
var SeatsSet string

// Result codes shared by the scripts. They are small integers so the Go side
// branches on numbers, never on strings.
const (
	OK        = 1  // the operation happened
	Already   = 2  // it had happened before for this request; nothing moved now
	Empty     = 0  // not enough stock in this shard; nothing moved
	NotSeeded = -1 // the shard has no stock hash (never seeded, or Redis lost it)
	BadArg    = -2 // an argument failed the script's own checks; nothing moved
	NoRecord  = -3 // restore of a request id that never deducted here
	Stale     = -4 // restore of a deduction from before the last re-seed
	Exists    = -5 // seed without overwrite found a live shard; nothing changed
	Fenced    = -6 // the shard is closed while a re-seed rebuilds it; nothing moved
)

// Codes of refill.lua beyond the shared ones.
const (
	RefillCounted = 3 // the shard is at a later epoch, whose facts count the units
	RefillNotYet  = 4 // the shard is at an earlier epoch; try again later
)
