package sale

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/stock"
)

// request is one client request as the service identifies it: its
// Idempotency-Key within its scope (the buyer), bound to a fingerprint of
// what it asks. Retries of the same request carry the same three; the same
// key with another fingerprint is another request, refused with 422.
type request struct {
	scope keys.ID // the buyer
	key   keys.ID // the client's Idempotency-Key
	op    string  // ledger.OpPurchase, …
	fp    string  // fingerprint: the operation and everything it asks
	line  int     // a cart's line (from 1): its own gate records; 0 for the request itself
	// program is the program the request takes from: its row is on that
	// program's primary, which alone is asked for it (zero: not known
	// here, every primary is).
	program keys.ID
}

// on is r taking from program.
func (r request) on(program keys.ID) request {
	r.program = program
	return r
}

// lineOf is the request of line i (from 0) of a cart request: the same
// ledger request, with gate records of its own.
func (r request) lineOf(i int) request {
	r.line = i + 1
	return r
}

// lineSuffix makes a line's ids its own. A client key cannot contain the
// NUL byte, so no request's ids equal a line's.
func (r request) lineSuffix() string {
	if r.line == 0 {
		return ""
	}
	return "\x00line\x00" + strconv.Itoa(r.line)
}

// newRequest fingerprints what a request asks: its operation and its
// fields in a fixed order (the scope is the buyer, so not repeated).
func newRequest(buyer, key keys.ID, op string, fields ...string) request {
	return request{scope: buyer, key: key, op: op, fp: op + "\x00" + strings.Join(fields, "\x00")}
}

// gateID is the id of the request's records in Redis (deductions, quota
// counts, seat owners) and of its ledger row key. It is derived from scope,
// key and fingerprint, so a reused key with another fingerprint gets its
// own records (and gives them back when the ledger refuses it), and a
// client can never name or collide with an id the service uses: client
// keys only ever go in through the hash.
func (r request) gateID() keys.ID {
	h := sha256.Sum256([]byte(r.scope.String() + "\x00" + r.key.String() + "\x00" + r.fp + r.lineSuffix()))
	return keys.MustID(hex.EncodeToString(h[:16]))
}

// keyID is the id of the client's key within its scope, whatever the
// fingerprint: the quota count remembers which keys it counted by it.
func (r request) keyID() keys.ID {
	h := sha256.Sum256([]byte(r.scope.String() + "\x00" + r.key.String() + r.lineSuffix()))
	return keys.MustID(hex.EncodeToString(h[:16]))
}

// joinKey is the key concurrent copies of the request join under on one
// replica.
func (r request) joinKey() string { return r.scope.String() + "\x00" + r.key.String() }

// ledger is the request as the ledger remembers it.
func (r request) ledger() ledger.Request {
	fp := sha256.Sum256([]byte(r.fp))
	return ledger.Request{Scope: r.scope, Key: r.key, Fingerprint: hex.EncodeToString(fp[:16]), Op: r.op}
}

// PurchaseGateID is the id of a purchase's records in Redis (its deduction,
// its quota counts): what an operator or a test looks for there.
func PurchaseGateID(a Ask, sku stock.SKU, q int64) keys.ID {
	return newRequest(a.Buyer, a.Key, ledger.OpPurchase, sku.Program.String(), sku.Ticket.String(), strconv.FormatInt(q, 10)).gateID()
}
