package seats

import (
	"strings"

	"github.com/stockgate/stockgate/keys"
)

// A seat hold's gate record names its section and seats, so that its end
// (a cancel, an expiry, a refund) releases exactly those seats in Redis.
// The ledger stores it as an opaque string; only this package reads it.
const gatePrefix = "seats:"

// EncodeGate is the gate record of a seat hold of ids in section.
func EncodeGate(section string, ids []string) string {
	return gatePrefix + section + ":" + strings.Join(ids, ",")
}

// IsGate reports whether g is a seat hold's record (well-formed or not).
func IsGate(g string) bool { return strings.HasPrefix(g, gatePrefix) }

// ValidGate reports whether g is a well-formed seat hold's record.
func ValidGate(g string) bool {
	_, _, ok := DecodeGate(g)
	return ok
}

// DecodeGate reads a gate record EncodeGate wrote; ok is false for any
// other record (a counted hold's shard parts, an empty record) or a
// malformed one.
func DecodeGate(g string) (section string, ids []string, ok bool) {
	rest, ok := strings.CutPrefix(g, gatePrefix)
	if !ok {
		return "", nil, false
	}
	section, list, ok := strings.Cut(rest, ":")
	if !ok || keys.CheckID(section) != nil || list == "" {
		return "", nil, false
	}
	ids = strings.Split(list, ",")
	for _, id := range ids {
		if keys.CheckID(id) != nil {
			return "", nil, false
		}
	}
	return section, ids, true
}
