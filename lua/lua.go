// Package lua embeds the Redis scripts stockgate runs, one operation per
// file. Each file opens with its KEYS/ARGV contract and its return codes;
// the Go side that calls a script lives in package shard, seats or lock.
//
// Every script touches only keys that share one hash tag (package keys makes
// sure of that). Every script is run with prelude.lua in front of it, so
// every one parses its arguments by the same rules (int, id), and a bug in
// a caller cannot move stock by a fraction, a negative or a huge amount.
// Every script replies with one shape: a table whose first element is its
// code (the constants below), then its values. Go never branches on a
// literal number from a script.
package lua

import _ "embed"

//go:embed prelude.lua
var prelude string

// Seed sets a shard's allotment and available stock.
var Seed = prelude + seedBody

//go:embed seed.lua
var seedBody string

// Deduct takes stock from a shard, once per request id.
var Deduct = prelude + deductBody

//go:embed deduct.lua
var deductBody string

// Restore gives a deduction back, once, capped at the shard's allotment.
var Restore = prelude + restoreBody

//go:embed restore.lua
var restoreBody string

// Refill adds units the ledger took back to a shard, once per return, at
// the return's gate epoch only.
var Refill = prelude + refillBody

//go:embed refill.lua
var refillBody string

// Fence closes or reopens a shard to deductions during a re-seed.
var Fence = prelude + fenceBody

//go:embed fence.lua
var fenceBody string

// Read returns a shard's available stock, allotment, epoch and fence.
var Read = prelude + readBody

//go:embed read.lua
var readBody string

// StreamAdd adds an outbox event to its partition's stream, once per
// event id.
var StreamAdd = prelude + streamAddBody

//go:embed stream_add.lua
var streamAddBody string

// QueueJoin gives a buyer its one place in a program's waiting room.
var QueueJoin = prelude + queueJoinBody

//go:embed queue_join.lua
var queueJoinBody string

// QueueAdvance is the waiting room pacer's step.
var QueueAdvance = prelude + queueAdvanceBody

//go:embed queue_advance.lua
var queueAdvanceBody string

// QueueSpend spends a buyer's admission on one request.
var QueueSpend = prelude + queueSpendBody

//go:embed queue_spend.lua
var queueSpendBody string

// QueueSettle ends a request's use of an admission: kept, or given back
// when the request was refused having moved nothing.
var QueueSettle = prelude + queueSettleBody

//go:embed queue_settle.lua
var queueSettleBody string

// QueueReserve lets a line hand out places up to the ledger's reservation.
var QueueReserve = prelude + queueReserveBody

//go:embed queue_reserve.lua
var queueReserveBody string

// QueueRestore makes a room's line from the ledger's facts.
var QueueRestore = prelude + queueRestoreBody

//go:embed queue_restore.lua
var queueRestoreBody string

// QueueResume fences a room's line after a failover or restart.
var QueueResume = prelude + queueResumeBody

//go:embed queue_resume.lua
var queueResumeBody string

// QueueRespend puts the admissions the ledger says were spent back into a
// restored line.
var QueueRespend = prelude + queueRespendBody

//go:embed queue_respend.lua
var queueRespendBody string

// Unlock releases a coordination lock by compare-and-delete.
var Unlock = prelude + unlockBody

//go:embed unlock.lua
var unlockBody string

// Renew extends a coordination lock by compare-and-expire.
var Renew = prelude + renewBody

//go:embed renew.lua
var renewBody string

// Quota counts a request against a buyer's per-SKU cap, once.
var Quota = prelude + quotaBody

//go:embed quota.lua
var quotaBody string

// Unquota releases a request's count, once.
var Unquota = prelude + unquotaBody

//go:embed unquota.lua
var unquotaBody string

// Budget counts, ends and extends the holds of one identity under its
// program's hold budget.
var Budget = prelude + budgetBody

//go:embed budget.lua
var budgetBody string

// SeatsHold holds seats of one section, all or nothing.
var SeatsHold = prelude + seatsHoldBody

//go:embed seats_hold.lua
var seatsHoldBody string

// SeatsBest holds the best q adjacent free seats of a section.
var SeatsBest = prelude + seatsBestBody

//go:embed seats_best.lua
var seatsBestBody string

// SeatsSet moves seats between states where they are in the expected one.
var SeatsSet = prelude + seatsSetBody

//go:embed seats_set.lua
var seatsSetBody string

// Result codes shared by the scripts. They are small integers so the Go side
// branches on numbers, never on strings.
const (
	OK        = 1  // the operation happened
	Already   = 2  // it had happened before for this request; nothing moved now
	Shared    = 3  // restore of a deduction another attempt still holds; nothing moved
	Empty     = 0  // not enough stock in this shard; nothing moved
	NotSeeded = -1 // the shard has no stock hash (never seeded, or Redis lost it)
	BadArg    = -2 // an argument failed the script's own checks; nothing moved
	NoRecord  = -3 // restore of a request id that never deducted here
	Stale     = -4 // restore of a deduction from before the last re-seed
	Exists    = -5 // seed without overwrite found a live shard; nothing changed
	Fenced    = -6 // the shard is closed while a re-seed rebuilds it; nothing moved
)

// Codes of seats_hold.lua and seats_best.lua.
const (
	SeatsHeld    = OK       // the seats are held by this hold now
	SeatsAgain   = Already  // a retry: this hold held them already
	SeatsTaken   = Empty    // held or sold by others (or no adjacent run free); nothing changed
	SeatsUnknown = NoRecord // not in the section's map; nothing changed
)

// Codes of unlock.lua and renew.lua.
const (
	LockDone     = OK    // released, or extended
	LockNotOwner = Empty // the lock is gone or another owner's; nothing changed
)

// Codes of refill.lua beyond the shared ones.
const (
	RefillCounted = 3 // the shard is at a later epoch, whose facts count the units
	RefillNotYet  = 4 // the shard is at an earlier epoch, or fenced and not yet written; try again later
)

// Codes of quota.lua beyond the shared ones.
const (
	QuotaKeyKnown = 3 // over the cap, and the request's key was counted before: look it up
)

// Codes of the queue scripts beyond the shared ones.
const (
	QueueExpired     = 3         // spend: admitted longer ago than the window
	QueueNotAdmitted = 4         // spend: the serving counter has not reached the position
	QueueFull        = 5         // join: every place the ledger reserved is given
	QueueLost        = NotSeeded // the line has no record (new, or lost by Redis): restore it
	QueueMoved       = -8        // Redis changed under the line (failover, restart): fence it (queue_resume)
	QueueUnclaimed   = 3         // settle: Redis has no spend of the buyer's (the line was lost since)
)
