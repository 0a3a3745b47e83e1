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
func EncodeGate(section keys.ID, ids []keys.ID) string {
	return gatePrefix + section.String() + ":" + keys.Join(ids, ",")
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
func DecodeGate(g string) (section keys.ID, ids []keys.ID, ok bool) {
	rest, ok := strings.CutPrefix(g, gatePrefix)
	if !ok {
		return keys.ID{}, nil, false
	}
	sec, list, ok := strings.Cut(rest, ":")
	if !ok || list == "" {
		return keys.ID{}, nil, false
	}
	section, err := keys.ParseID(sec)
	if err != nil {
		return keys.ID{}, nil, false
	}
	for text := range strings.SplitSeq(list, ",") {
		id, err := keys.ParseID(text)
		if err != nil {
			return keys.ID{}, nil, false
		}
		ids = append(ids, id)
	}
	return section, ids, true
}
