package gateway

import (
	"encoding/json"
	"testing"
	"time"
)

// The waiting room's status is written by hand (it is the checks' flood);
// it must be byte for byte what encoding/json writes, for every field set
// or not and for strings that need escaping.
func TestQueueStatusJSON(t *testing.T) {
	ahead := int64(40)
	zero := int64(0)
	opens := time.Date(2026, 11, 24, 10, 0, 0, 123456789, time.UTC)
	for _, v := range []queueStatusView{
		{Program: "show-1", Buyer: "alice", Ticket: "show-1.alice.late.41.1800000000.abc_DEF-123", State: "waiting", Position: 41,
			Ahead: &ahead, WaitSeconds: 20, OpensAt: opens, RetryAfterSeconds: 5, AsOf: opens.Add(time.Hour)},
		{Program: "p", Buyer: "b", Ticket: "t", State: "waiting", Ahead: &zero, OpensAt: opens.Truncate(time.Second)},
		{Program: "p", Buyer: "b", Ticket: "t", State: "admitted", Position: 1, AdmissionToken: "tok.en", OpensAt: opens, AsOf: opens.Truncate(time.Millisecond)},
		{Program: "p", Buyer: "b", Ticket: "t", State: "sold-out", Position: 7, OpensAt: time.Time{}},
		{Program: `q"uo\\te`, Buyer: "<b>&", Ticket: "\x01\u00e9\u2028", State: "expired", OpensAt: opens.In(time.FixedZone("x", 3600))},
	} {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := v.appendJSON(nil); string(got) != string(want) {
			t.Errorf("appendJSON = %s\nwant          %s", got, want)
		}
	}
}
