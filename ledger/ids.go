package ledger

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"hash/fnv"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

// NewID returns a random 128-bit id in hex.
func NewID() keys.ID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return keys.MustID(hex.EncodeToString(b[:]))
}

// NewIDOf returns a random id for a row of sku's (an order, a hold): 32
// bits naming the SKU (SKULane), then 96 random ones, in hex. Any replica
// can tell from the id alone which SKU the row belongs to, so a fleet of
// primaries routes confirms, cancels and refunds of one SKU to its
// primary without reading the row first (fleet).
func NewIDOf(sku stock.SKU) keys.ID {
	var b [16]byte
	_, _ = rand.Read(b[4:])
	binary.BigEndian.PutUint32(b[:4], SKULane(sku))
	return keys.MustID(hex.EncodeToString(b[:]))
}

// SKULane is the 32-bit name of a SKU that its rows' ids begin with.
func SKULane(sku stock.SKU) uint32 {
	h := fnv.New32a()
	h.Write([]byte(sku.Program.String()))
	h.Write([]byte{0})
	h.Write([]byte(sku.Ticket.String()))
	return h.Sum32()
}

// LaneOf is the lane an order or hold id names (NewIDOf), or for an id
// made otherwise, a hash of it: the same for every replica either way.
func LaneOf(id keys.ID) uint32 {
	s := id.String()
	if len(s) == 32 {
		if b, err := hex.DecodeString(s[:8]); err == nil {
			return binary.BigEndian.Uint32(b)
		}
	}
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}
