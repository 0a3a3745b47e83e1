package waitroom_test

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/ledger"
	"github.com/stockgate/stockgate/lock"
	"github.com/stockgate/stockgate/waitroom"
)

// A replica that remembers a room turned off and on again since (its
// cache keeps a room a second, longer when the room's notice is lost: here
// no replica runs RunNotices, so none hears it) met the new room's line in
// Redis, took it for lost and made the old room's line over it: the new
// line's joins and spends were gone (helper-109). The ledger says which
// room is current: the old room's token is refused as the new room would
// refuse it, a join joins the new line, and the new line keeps its joins.
func TestARoomMadeAgainKeepsItsLine(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.SharedCluster(t).Client()
	l, err := ledger.Open(ctx, ledger.Options{Driver: ledger.SQLite, DSN: testenv.SQLitePath(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	replica := func() *waitroom.Rooms {
		locker, err := lock.New(lock.Options{Redis: rdb})
		if err != nil {
			t.Fatal(err)
		}
		r, err := waitroom.New(waitroom.Options{Ledger: l, Store: waitroom.NewStore(rdb), Locker: locker,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b, c := replica(), replica(), replica()
	prog := keys.MustID(testenv.ID(t, "remade"))
	room := waitroom.Config{Program: prog, OpensAt: time.Now().Add(-time.Minute), Rate: 10, Window: time.Minute, PerRemaining: 1}
	if _, err := a.Put(ctx, room); err != nil {
		t.Fatal(err)
	}
	// b and c read the old room (and make its line).
	if _, _, err := b.Join(ctx, prog, waitroom.JoinAsk{Buyer: keys.MustID("x1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Queued(ctx, prog); err != nil {
		t.Fatal(err)
	}
	old, err := l.Queue(ctx, prog)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, prog); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(ctx, room); err != nil {
		t.Fatal(err)
	}
	cur, err := l.Queue(ctx, prog)
	if err != nil || cur.Room() == old.Room() {
		t.Fatalf("the room made again = %v %v, the old one %v", cur.Room(), err, old.Room())
	}
	y1, _, err := a.Join(ctx, prog, waitroom.JoinAsk{Buyer: keys.MustID("y1")})
	if err != nil {
		t.Fatal(err)
	}
	store := waitroom.NewStore(rdb)
	late := func(step string, want int64) {
		t.Helper()
		st, err := store.State(ctx, prog, cur.Room())
		if err != nil || st.Lost || st.Late != want {
			t.Fatalf("%s: the new room's line = %+v %v, want %d joined", step, st, err, want)
		}
	}
	late("y1 joined through a", 1)

	// b still remembers the old room: a token the old room signed gets
	// through its signer, and Redis has another room's line.
	secret, err := hex.DecodeString(old.Secret)
	if err != nil {
		secret = []byte(old.Secret)
	}
	x1 := keys.MustID("x1")
	token := waitroom.NewSigner(secret).Admission(prog, x1, 1, time.Now())
	_, err = b.Admit(ctx, prog, x1, token, keys.MustID("r1"), keys.MustID("k1"))
	if !errors.Is(err, waitroom.ErrAdmissionInvalid) {
		t.Errorf("the old room's token through a replica that remembers it = %v, want %v", err, waitroom.ErrAdmissionInvalid)
	}
	late("the old room's token refused", 1)

	// c remembers the old room too: its join joins the new line, with a
	// ticket the new room reads.
	x2, _, err := c.Join(ctx, prog, waitroom.JoinAsk{Buyer: keys.MustID("x2")})
	if err != nil {
		t.Fatalf("a join through a replica that remembers the old room = %v", err)
	}
	late("x2 joined through c", 2)
	for _, st := range []waitroom.Status{y1, x2} {
		if got, err := a.Check(ctx, prog, st.Ticket); err != nil || got.Position != st.Position {
			t.Errorf("%s's place in the new room = %+v %v, joined at %d", st.Buyer, got, err, st.Position)
		}
	}
}
