package sale_test

import (
	"context"
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/shard/shardmem"
)

// movingEvents is a ledger whose first KnownEvents misses hide, as the
// primaries asked at once miss the events of a program moving between
// two of them (the new one read before the copy, the old one after the
// delete).
type movingEvents struct {
	sale.Ledger
	hide  keys.ID
	calls int
}

func (l *movingEvents) KnownEvents(ctx context.Context, ids []keys.ID) ([]keys.ID, error) {
	l.calls++
	if l.calls == 1 {
		return nil, nil
	}
	return append([]keys.ID(nil), l.hide), nil
}

// An event a program's move hid from the first look is not called
// missing: an operator makes good every id the answer names, so a false
// one tells a buyer's money twice (helper-87 #6). What neither look
// finds is.
func TestMissingEventsLooksTwice(t *testing.T) {
	moved, gone := keys.MustID("moved"), keys.MustID("gone")
	led := &movingEvents{hide: moved}
	s, _ := sale.TestService(t, shardmem.New(), nil, func(o *sale.Options) {
		led.Ledger = o.Ledger
		o.Ledger = led
	})
	missing, err := s.MissingEvents(context.Background(), []keys.ID{moved, gone, moved})
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || missing[0] != gone || led.calls != 2 {
		t.Errorf("missing = %v after %d looks, want only %v after 2", missing, led.calls, gone)
	}
}
