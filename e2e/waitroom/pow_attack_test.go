package waitroom_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stockgate/stockgate/app"
	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/internal/testenv"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/waitroom"
)

// Attacks on the waiting room's proof of work (58b598d) where it meets
// the older parts: the join body's JSON, rooms deleted and made again,
// settings changed under a puzzle, rejoining by ticket, other programs,
// join_from, admin's PUT, two replicas, Redis gone, the purchase door
// and the Go client. Each answer to a client mistake must be a 4xx
// problem+json, and a refused join must place nobody.

// paRoom is the body of a room open now, with bits of proof of work
// (omitted when bits < 0) and the members of extra (",\"k\":v" each).
func paRoom(bits int, extra string) string {
	b := `{"opens_in_seconds":0,"rate_per_second":50,"window_seconds":60,"per_remaining":1` + extra
	if bits >= 0 {
		b += fmt.Sprintf(`,"proof_of_work_bits":%d`, bits)
	}
	return b + "}"
}

// paJoin posts body as a join and decodes the answer; every answer must
// be a 2xx, or a problem+json that is not a 5xx unless allow5xx.
func paJoin(t *testing.T, e *systest.Env, program keys.ID, body string, allow5xx bool) (systest.Reply, queueReply, powProblem) {
	t.Helper()
	r, q := qaJoinWith(t, e, program, body)
	var p powProblem
	if r.Status >= 400 {
		if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("join %.120s = %d with Content-Type %q, want application/problem+json", body, r.Status, ct)
		}
		if err := json.Unmarshal(r.Body, &p); err != nil {
			t.Errorf("join %.120s = %d %s: %v", body, r.Status, r.Body, err)
		}
	}
	if r.Status >= 500 && !allow5xx {
		t.Errorf("join %.120s = %d %s: a 5xx for a client's mistake", body, r.Status, r.Body)
	}
	return r, q, p
}

// paBody is a join body of buyer with proof (a JSON value, "" for none)
// and the members of extra.
func paBody(buyer, proof, extra string) string {
	b := fmt.Sprintf(`{"buyer":%q`, buyer) + extra
	if proof != "" {
		b += `,"proof":` + proof
	}
	return b + "}"
}

// paProof is a proof's JSON.
func paProof(challenge, nonce string) string {
	b, _ := json.Marshal(map[string]string{"challenge": challenge, "nonce": nonce})
	return string(b)
}

// paPuzzle asks for buyer's puzzle (a join without proof) and returns it.
func paPuzzle(t *testing.T, e *systest.Env, program keys.ID, buyer string) powProblem {
	t.Helper()
	r, _, p := paJoin(t, e, program, paBody(buyer, "", ""), false)
	if r.Status != http.StatusForbidden || systest.ProblemKind(r) != "proof-of-work-required" || p.Puzzle == nil ||
		!strings.Contains(p.Puzzle.Challenge, "."+buyer+".") {
		t.Fatalf("%s's join without proof = %d %s", buyer, r.Status, r.Body)
	}
	return p
}

// paSolveWith finds a nonce prefix+N (N counting up in decimal) that
// solves the puzzle.
func paSolveWith(t *testing.T, p powProblem, prefix string) string {
	t.Helper()
	pz := waitroom.Puzzle{Challenge: p.Puzzle.Challenge, Bits: p.Puzzle.Difficulty}
	for n := 0; n < 1<<28; n++ {
		if nonce := fmt.Sprintf("%s%d", prefix, n); waitroom.Solves(pz, nonce) {
			return nonce
		}
	}
	t.Fatalf("no nonce %s… solves %+v", prefix, p.Puzzle)
	return ""
}

// paRefused checks that r is a 403 of kind with a new puzzle for buyer.
func paRefused(t *testing.T, what string, r systest.Reply, p powProblem, kind, buyer string) {
	t.Helper()
	if r.Status != http.StatusForbidden || systest.ProblemKind(r) != kind || p.Puzzle == nil ||
		!strings.Contains(p.Puzzle.Challenge, "."+buyer+".") || p.Puzzle.Difficulty < 1 {
		t.Errorf("%s = %d %s, want 403 %s with a puzzle for %s", what, r.Status, r.Body, kind, buyer)
	}
}

// Hostile "proof" members: wrong types, nulls, missing, unknown and
// repeated members, huge strings, unicode and bytes that are not UTF-8,
// dots and colons in the nonce, challenges with dots added or removed,
// a tampered body or signature. Each is a 4xx problem+json (400/422 for
// what does not decode, 403 with a new puzzle for a proof that does not
// hold, 413 past the body limit), none places anyone; a nonce with dots,
// a colon or (short) unicode that solves the puzzle is a nonce like any.
func TestAttackPowHostileProofJSON(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	e := systest.New(t, "sqlite")
	program := systest.NewSKU(t).Program
	putQueue(t, e, program, paRoom(4, ""))

	p := paPuzzle(t, e, program, "ann")
	ch := p.Puzzle.Challenge
	good := paSolveWith(t, p, "")
	wrong := "w0"
	for n := 1; leading(map[string]string{"challenge": ch, "nonce": wrong}) >= 4; n++ {
		wrong = fmt.Sprintf("w%d", n)
	}
	parts := strings.Split(ch, ".")
	if len(parts) != 7 {
		t.Fatalf("challenge %q has %d parts", ch, len(parts))
	}
	// notSolving is prefix+suffix where it does not solve ann's puzzle
	// (after the server's reading: bytes not UTF-8 become U+FFFD).
	notSolving := func(prefix, seen string) string {
		for n := 0; ; n++ {
			if leading(map[string]string{"challenge": ch, "nonce": seen + fmt.Sprint(n)}) < p.Puzzle.Difficulty {
				return prefix + fmt.Sprint(n)
			}
		}
	}
	tamperedBits := strings.Join(append(append(append([]string{}, parts[:3]...), "1"), parts[4:]...), ".")
	upperMAC := strings.Join(parts[:6], ".") + "." + strings.ToUpper(parts[6])

	for _, c := range []struct {
		name, proof, extra string
		status             int
		kind               string
	}{
		{"a string", `"` + ch + `"`, "", http.StatusUnprocessableEntity, "invalid-field"},
		{"a number", `5`, "", http.StatusUnprocessableEntity, "invalid-field"},
		{"true", `true`, "", http.StatusUnprocessableEntity, "invalid-field"},
		{"an array", `[` + paProof(ch, good) + `]`, "", http.StatusUnprocessableEntity, "invalid-field"},
		{"null", `null`, "", http.StatusForbidden, "proof-of-work-required"},
		{"{}", `{}`, "", http.StatusForbidden, "proof-of-work-required"},
		{"null members", `{"challenge":null,"nonce":null}`, "", http.StatusForbidden, "proof-of-work-required"},
		{"empty members", `{"challenge":"","nonce":""}`, "", http.StatusForbidden, "proof-of-work-required"},
		{"a numeric challenge", `{"challenge":5,"nonce":"1"}`, "", http.StatusUnprocessableEntity, "invalid-field"},
		{"a numeric nonce", fmt.Sprintf(`{"challenge":%q,"nonce":%s}`, ch, good), "", http.StatusUnprocessableEntity, "invalid-field"},
		{"an object nonce", fmt.Sprintf(`{"challenge":%q,"nonce":{}}`, ch), "", http.StatusUnprocessableEntity, "invalid-field"},
		{"no nonce", fmt.Sprintf(`{"challenge":%q}`, ch), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"no challenge", fmt.Sprintf(`{"nonce":%q}`, good), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"an empty nonce", paProof(ch, ""), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"an unknown member", fmt.Sprintf(`{"challenge":%q,"nonce":%q,"bits":1}`, ch, good), "", http.StatusBadRequest, "malformed-json"},
		{"a repeated member", fmt.Sprintf(`{"challenge":%q,"nonce":%q,"Nonce":%q}`, ch, wrong, good), "", http.StatusBadRequest, "malformed-json"},
		{"a repeated proof", paProof(ch, good), `,"proof":null`, http.StatusBadRequest, "malformed-json"},
		{"a wrong nonce", paProof(ch, wrong), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a 65-byte nonce", paProof(ch, strings.Repeat("7", 65)), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a 3000-byte nonce", paProof(ch, strings.Repeat("7", 3000)), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a 3500-dot challenge", paProof(strings.Repeat(".", 3500), good), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a challenge with a dot part added", paProof(ch+".x", good), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a challenge with a dot part before", paProof("x."+ch, good), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a challenge with a dot in its salt", paProof(strings.Replace(ch, "."+parts[5]+".", "."+parts[5][:4]+"."+parts[5][4:]+".", 1), good), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a challenge with a part dropped", paProof(strings.Join(append(append([]string{}, parts[:5]...), parts[6]), "."), good), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a challenge with its bits lowered", paProof(tamperedBits, good), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a challenge with its MAC in upper case", paProof(upperMAC, good), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a challenge with a space after", paProof(ch+" ", good), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a challenge in unicode", paProof(strings.Replace(ch, "pw1", "pw１", 1), good), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a NUL and a line separator in the nonce", paProof(ch, notSolving("\x00\u2028", "\x00\u2028")), "", http.StatusForbidden, "proof-of-work-invalid"},
		{"a challenge over the body limit", paProof(strings.Repeat("a", 5000), good), "", http.StatusRequestEntityTooLarge, "body-too-large"},
	} {
		r, _, pp := paJoin(t, e, program, paBody("ann", c.proof, c.extra), false)
		if r.Status != c.status || systest.ProblemKind(r) != c.kind {
			t.Errorf("proof %s = %d %s, want %d %s", c.name, r.Status, r.Body, c.status, c.kind)
			continue
		}
		if r.Status == http.StatusForbidden {
			paRefused(t, "proof "+c.name, r, pp, c.kind, "ann")
		}
	}
	// Bytes that are not UTF-8 in the nonce (encoding/json makes them
	// U+FFFD): refused like any wrong nonce, never a 5xx.
	raw := `{"buyer":"ann","proof":{"challenge":"` + ch + "\",\"nonce\":\"" + notSolving("\xff\xfe", "\ufffd\ufffd") + `"}}`
	if r, _, pp := paJoin(t, e, program, raw, false); r.Status != http.StatusForbidden || pp.Puzzle == nil {
		t.Errorf("a nonce with bytes not UTF-8 = %d %s", r.Status, r.Body)
	}
	if v := getRoom(t, e, program); v.Joined != 0 {
		t.Fatalf("hostile proofs placed %d buyers", v.Joined)
	}

	// Member names as encoding/json matches them (any case): a proof.
	r, q, _ := paJoin(t, e, program, fmt.Sprintf(`{"BUYER":"ann","Proof":{"CHALLENGE":%q,"Nonce":%q}}`, ch, good), false)
	if r.Status != http.StatusCreated || q.Ticket == "" {
		t.Fatalf("ann's good proof, names in other cases = %d %s", r.Status, r.Body)
	}
	// Dots, a colon and unicode in a nonce that solves: accepted.
	for i, prefix := range []string{"1.2.3.", "a:b:", "é.ü:", "🙂"} {
		buyer := fmt.Sprintf("nonce%d", i)
		pz := paPuzzle(t, e, program, buyer)
		nonce := paSolveWith(t, pz, prefix)
		if r, q, _ := paJoin(t, e, program, paBody(buyer, paProof(pz.Puzzle.Challenge, nonce), ""), false); r.Status != http.StatusCreated || q.Ticket == "" {
			t.Errorf("%s's nonce %q = %d %s", buyer, nonce, r.Status, r.Body)
		}
	}
	if v := getRoom(t, e, program); v.Joined != 5 {
		t.Fatalf("joined %d, want 5 (ann and the four nonces)", v.Joined)
	}
}

// The API and the OpenAPI document say a nonce is 1..64 characters
// (OpenAPI: maxLength 64, which JSON Schema counts in characters); the
// gateway counts bytes. A nonce of 40 characters, 83 bytes, that solves
// the puzzle is a valid proof by the documents.
func TestAttackPowNonceLengthInCharacters(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	e := systest.New(t, "sqlite")
	program := systest.NewSKU(t).Program
	putQueue(t, e, program, paRoom(4, ""))
	p := paPuzzle(t, e, program, "ann")
	nonce := paSolveWith(t, p, strings.Repeat("é", 37))
	n := utf8.RuneCountInString(nonce)
	if n > 64 {
		t.Fatalf("nonce of %d characters", n)
	}
	r, q, _ := paJoin(t, e, program, paBody("ann", paProof(p.Puzzle.Challenge, nonce), ""), false)
	if r.Status != http.StatusCreated || q.Ticket == "" {
		t.Errorf("a solving nonce of %d characters (%d bytes), within the documented 1..64 characters = %d %s",
			n, len(nonce), r.Status, r.Body)
	}
}

// A puzzle of a room that was turned off and on again (a new secret) is
// refused with a new puzzle, by the replica that changed the room at
// once and by the other once its second of memory has passed; it places
// nobody in the new room. A ticket of the old room is not a ticket of the
// new one either (400, even with a good proof).
func TestAttackPowRecreatedRoom(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	a, b := systest.Pair(t, "sqlite")
	program := systest.NewSKU(t).Program
	putQueue(t, a, program, paRoom(4, ""))

	old := paPuzzle(t, b, program, "ann") // b remembers the room
	oldProof := paProof(old.Puzzle.Challenge, paSolveWith(t, old, ""))
	bob := paPuzzle(t, a, program, "bob")
	r, bobQ, _ := paJoin(t, a, program, paBody("bob", paProof(bob.Puzzle.Challenge, paSolveWith(t, bob, "")), ""), false)
	if r.Status != http.StatusCreated {
		t.Fatalf("bob's join = %d %s", r.Status, r.Body)
	}

	if r := a.Do(t, http.MethodDelete, "/v1/admin/programs/"+program.String()+"/queue", nil, ""); r.Status != http.StatusNoContent {
		t.Fatalf("DELETE queue = %d %s", r.Status, r.Body)
	}
	if r, _, _ := paJoin(t, a, program, paBody("ann", oldProof, ""), false); r.Status != http.StatusNotFound {
		t.Errorf("ann's old proof with no room = %d %s, want 404", r.Status, r.Body)
	}
	putQueue(t, a, program, paRoom(4, ""))

	r, _, p := paJoin(t, a, program, paBody("ann", oldProof, ""), false)
	paRefused(t, "the old room's proof on a", r, p, "proof-of-work-invalid", "ann")
	var accepted []string
	staleTicket := ""
	systest.WaitFor(t, 10*time.Second, "b to refuse the old room's proof", func() bool {
		r, q, _ := paJoin(t, b, program, paBody("ann", oldProof, ""), false)
		if r.Status < 300 {
			accepted = append(accepted, fmt.Sprintf("%d %s", r.Status, r.Body))
			staleTicket = q.Ticket
		}
		return r.Status == http.StatusForbidden && systest.ProblemKind(r) == "proof-of-work-invalid"
	})
	if len(accepted) > 0 {
		t.Logf("b took the old room's proof %d times while it remembered the old room (its second of memory), first: %s",
			len(accepted), accepted[0])
		r, _ := queueCheck(t, b, program, staleTicket)
		t.Logf("that ticket, checked on b now: %d %s", r.Status, r.Body)
	}
	if v := getRoom(t, a, program); v.Joined != 0 {
		t.Fatalf("the new room has %d joined after only old proofs, want 0", v.Joined)
	}
	// bob's old ticket with a good proof of the new room: not a ticket.
	nb := paPuzzle(t, a, program, "bob")
	newProof := paProof(nb.Puzzle.Challenge, paSolveWith(t, nb, ""))
	r, _, _ = paJoin(t, a, program, paBody("bob", newProof, fmt.Sprintf(`,"ticket":%q`, bobQ.Ticket)), false)
	if r.Status != http.StatusBadRequest || systest.ProblemKind(r) != "invalid-queue-ticket" {
		t.Errorf("bob's old room's ticket with a new proof = %d %s, want 400", r.Status, r.Body)
	}
	// The new room's puzzle, solved: ann is the first of the new line.
	np := paPuzzle(t, b, program, "ann")
	r, q, _ := paJoin(t, a, program, paBody("ann", paProof(np.Puzzle.Challenge, paSolveWith(t, np, "")), ""), false)
	if r.Status != http.StatusCreated || q.Ticket == "" {
		t.Fatalf("ann's new proof = %d %s", r.Status, r.Body)
	}
	if v := getRoom(t, a, program); v.Joined != 1 {
		t.Fatalf("the new room has %d joined, want 1", v.Joined)
	}
}

// A puzzle solved before the room asked for more bits is refused (with a
// harder puzzle) by both replicas once they know the setting, and places
// nobody; a harder puzzle solved before the room asked for fewer is good.
// GET shows each setting.
func TestAttackPowBitsChangedUnderAPuzzle(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	a, b := systest.Pair(t, "sqlite")
	program := systest.NewSKU(t).Program
	putQueue(t, a, program, paRoom(4, ""))
	easy := paPuzzle(t, b, program, "ann")
	if easy.Puzzle.Difficulty != 4 {
		t.Fatalf("difficulty %d, want 4", easy.Puzzle.Difficulty)
	}
	easyProof := paProof(easy.Puzzle.Challenge, paSolveWith(t, easy, ""))

	putQueue(t, a, program, paRoom(10, ""))
	if v := getRoom(t, a, program); v.PowBits != 10 {
		t.Errorf("GET on a shows %d bits, want 10", v.PowBits)
	}
	systest.WaitFor(t, 10*time.Second, "GET on b to show 10 bits", func() bool { return getRoom(t, b, program).PowBits == 10 })
	r, _, p := paJoin(t, a, program, paBody("ann", easyProof, ""), false)
	paRefused(t, "a 4-bit proof in a 10-bit room on a", r, p, "proof-of-work-invalid", "ann")
	if p.Puzzle != nil && p.Puzzle.Difficulty < 10 {
		t.Errorf("the new puzzle asks %d bits in a 10-bit room", p.Puzzle.Difficulty)
	}
	systest.WaitFor(t, 10*time.Second, "b to refuse a 4-bit proof in a 10-bit room", func() bool {
		r, _, p := paJoin(t, b, program, paBody("ann", easyProof, ""), false)
		return r.Status == http.StatusForbidden && p.Puzzle != nil && p.Puzzle.Difficulty >= 10
	})
	if v := getRoom(t, a, program); v.Joined > 1 {
		t.Fatalf("joined %d", v.Joined)
	}
	joinedBefore := getRoom(t, a, program).Joined // 1 if b took ann's proof while it remembered 4 bits

	hard := paPuzzle(t, a, program, "bob")
	hardProof := paProof(hard.Puzzle.Challenge, paSolveWith(t, hard, ""))
	putQueue(t, a, program, paRoom(4, ""))
	for _, e := range []*systest.Env{b, a} {
		if r, q, _ := paJoin(t, e, program, paBody("bob", hardProof, ""), false); r.Status >= 300 || q.Ticket == "" {
			t.Errorf("a harder proof in a room asking fewer bits = %d %s", r.Status, r.Body)
		}
	}
	if v := getRoom(t, a, program); v.Joined != joinedBefore+1 || v.PowBits != 4 {
		t.Fatalf("room %+v, want %d joined at 4 bits", v, joinedBefore+1)
	}
}

// Rejoining with a ticket in a room that asks for proof of work: without
// a proof it is refused with a puzzle (before the ticket is looked at);
// with one, the same place. A ticket of another buyer, or garbage, with
// a good proof is 400 and places nobody. The client's RejoinQueue solves
// the puzzle and keeps the place.
func TestAttackPowRejoinWithTicket(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	a, b := systest.Pair(t, "sqlite")
	program := systest.NewSKU(t).Program
	putQueue(t, a, program, paRoom(4, ""))
	p := paPuzzle(t, a, program, "ann")
	annProof := paProof(p.Puzzle.Challenge, paSolveWith(t, p, ""))
	r, ann, _ := paJoin(t, a, program, paBody("ann", annProof, ""), false)
	if r.Status != http.StatusCreated {
		t.Fatalf("ann's join = %d %s", r.Status, r.Body)
	}
	withTicket := func(tk string) string { return fmt.Sprintf(`,"ticket":%q`, tk) }

	r, _, pp := paJoin(t, b, program, paBody("ann", "", withTicket(ann.Ticket)), false)
	paRefused(t, "ann's rejoin with her ticket, no proof", r, pp, "proof-of-work-required", "ann")
	if r, q, _ := paJoin(t, b, program, paBody("ann", annProof, withTicket(ann.Ticket)), false); r.Status != http.StatusOK || q.Ticket != ann.Ticket {
		t.Errorf("ann's rejoin with her ticket and proof = %d %s", r.Status, r.Body)
	}
	p2 := paPuzzle(t, b, program, "ann")
	if r, q, _ := paJoin(t, a, program, paBody("ann", paProof(p2.Puzzle.Challenge, paSolveWith(t, p2, "")), withTicket(ann.Ticket)), false); r.Status != http.StatusOK || q.Ticket != ann.Ticket {
		t.Errorf("ann's rejoin with her ticket and a new proof = %d %s", r.Status, r.Body)
	}

	bp := paPuzzle(t, a, program, "bob")
	bobProof := paProof(bp.Puzzle.Challenge, paSolveWith(t, bp, ""))
	for _, tk := range []string{ann.Ticket, "garbage", ann.Ticket + "x", strings.Repeat("a.", 200)} {
		r, _, _ := paJoin(t, a, program, paBody("bob", bobProof, withTicket(tk)), false)
		if r.Status != http.StatusBadRequest || systest.ProblemKind(r) != "invalid-queue-ticket" {
			t.Errorf("bob with ticket %.40q and his proof = %d %s, want 400", tk, r.Status, r.Body)
		}
	}
	// ann's ticket with bob's proof: the proof is refused first.
	r, _, pp = paJoin(t, a, program, paBody("ann", bobProof, withTicket(ann.Ticket)), false)
	paRefused(t, "ann's ticket with bob's proof", r, pp, "proof-of-work-invalid", "ann")
	if v := getRoom(t, a, program); v.Joined != 1 {
		t.Fatalf("joined %d, want 1 (ann)", v.Joined)
	}

	cl, err := client.New(client.Options{BaseURL: b.URL})
	if err != nil {
		t.Fatal(err)
	}
	st, err := cl.RejoinQueue(t.Context(), program.String(), "ann", ann.Ticket)
	if err != nil || st.Ticket != ann.Ticket {
		t.Errorf("the client's rejoin = %+v, %v", st, err)
	}
	_, err = cl.RejoinQueue(t.Context(), program.String(), "bob", ann.Ticket)
	var prob *client.Problem
	if !errors.As(err, &prob) || prob.Status != http.StatusBadRequest {
		t.Errorf("the client's rejoin of bob with ann's ticket = %v, want a 400 problem", err)
	}
	if v := getRoom(t, a, program); v.Joined != 1 {
		t.Fatalf("joined %d, want 1 (ann)", v.Joined)
	}
}

// A proof solved for program A is refused on program B (and places
// nobody there), and still good on A; a program without a room is 404,
// one whose room asks for no proof ignores it.
func TestAttackPowCrossProgram(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	a, b := systest.Pair(t, "sqlite")
	pa, pb, pc, pd := systest.NewSKU(t).Program, systest.NewSKU(t).Program, systest.NewSKU(t).Program, systest.NewSKU(t).Program
	putQueue(t, a, pa, paRoom(4, ""))
	putQueue(t, a, pb, paRoom(4, ""))
	putQueue(t, a, pd, paRoom(0, ""))
	p := paPuzzle(t, a, pa, "ann")
	proofA := paProof(p.Puzzle.Challenge, paSolveWith(t, p, ""))

	r, _, pp := paJoin(t, b, pb, paBody("ann", proofA, ""), false)
	paRefused(t, "A's proof on B", r, pp, "proof-of-work-invalid", "ann")
	if pp.Puzzle != nil && !strings.Contains(pp.Puzzle.Challenge, "."+pb.String()+".") {
		t.Errorf("B's new puzzle %q is not B's", pp.Puzzle.Challenge)
	}
	if r, _, _ := paJoin(t, b, pc, paBody("ann", proofA, ""), false); r.Status != http.StatusNotFound {
		t.Errorf("A's proof on a program with no room = %d %s, want 404", r.Status, r.Body)
	}
	if r, q, _ := paJoin(t, b, pd, paBody("ann", proofA, ""), false); r.Status != http.StatusCreated || q.Ticket == "" {
		t.Errorf("A's proof on a room asking none = %d %s, want 201", r.Status, r.Body)
	}
	if v := getRoom(t, a, pb); v.Joined != 0 {
		t.Fatalf("B has %d joined", v.Joined)
	}
	if r, _, _ := paJoin(t, b, pa, paBody("ann", proofA, ""), false); r.Status != http.StatusCreated {
		t.Errorf("A's proof on A after = %d %s", r.Status, r.Body)
	}
}

// Before join_from a join is 409 queue-not-open, with or without a
// proof, and hands out no puzzle; once the line takes joins, the puzzle
// is asked, and a proof solved then is refused (409, nobody placed) if
// admin moves join_from back into the future.
func TestAttackPowBeforeJoinFrom(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	e := systest.New(t, "sqlite")
	program := systest.NewSKU(t).Program
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	opens := time.Now().Add(2 * time.Hour).UTC().Format(time.RFC3339)
	room := func(joinFrom string) string {
		return fmt.Sprintf(`{"opens_at":%q,"join_from":%q,"rate_per_second":10,"window_seconds":60,"per_remaining":1,"proof_of_work_bits":4}`, opens, joinFrom)
	}
	putQueue(t, e, program, room(later))
	for _, proof := range []string{"", `null`, paProof("pw1.x", "1"), `{}`} {
		r, _, p := paJoin(t, e, program, paBody("ann", proof, ""), false)
		if r.Status != http.StatusConflict || systest.ProblemKind(r) != "queue-not-open" || p.Puzzle != nil {
			t.Errorf("a join (proof %q) before join_from = %d %s, want 409 queue-not-open and no puzzle", proof, r.Status, r.Body)
		}
	}
	putQueue(t, e, program, room(time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)))
	p := paPuzzle(t, e, program, "ann")
	proof := paProof(p.Puzzle.Challenge, paSolveWith(t, p, ""))
	putQueue(t, e, program, room(later))
	if r, _, _ := paJoin(t, e, program, paBody("ann", proof, ""), false); r.Status != http.StatusConflict {
		t.Errorf("a solved proof after join_from moved later = %d %s, want 409", r.Status, r.Body)
	}
	if v := getRoom(t, e, program); v.Joined != 0 {
		t.Fatalf("joined %d before join_from", v.Joined)
	}
	putQueue(t, e, program, room(time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)))
	r, q, _ := paJoin(t, e, program, paBody("ann", proof, ""), false)
	if r.Status != http.StatusCreated || q.State != "waiting" || q.Position != 0 {
		t.Errorf("the proof once joins are taken again = %d %s, want 201 waiting (an early join, no position)", r.Status, r.Body)
	}
}

// PUT replaces the whole room: a PUT that leaves proof_of_work_bits out
// (or sends null, or 0) turns the proof of work off, as "0, the default"
// says; GET shows it; a join then needs nothing. The Go client's
// QueueConfig omits a 0, so its PutQueue turns it off the same way, and
// its GetQueue reads the setting.
func TestAttackPowPutWithoutTheField(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	a, b := systest.Pair(t, "sqlite")
	program := systest.NewSKU(t).Program
	ctx := t.Context()
	cl, err := client.New(client.Options{BaseURL: a.URL})
	if err != nil {
		t.Fatal(err)
	}
	for i, off := range []string{paRoom(-1, ""), paRoom(-1, `,"proof_of_work_bits":null`), paRoom(0, "")} {
		putQueue(t, a, program, paRoom(6, `,"checkout_url":"https://shop.example/buy"`))
		if v := getRoom(t, a, program); v.PowBits != 6 || v.Checkout != "https://shop.example/buy" {
			t.Fatalf("GET = %+v", v)
		}
		systest.WaitFor(t, 10*time.Second, "b to ask for proof", func() bool {
			r, _, _ := paJoin(t, b, program, paBody("probe", "", ""), false)
			return r.Status == http.StatusForbidden
		})
		if q, err := cl.GetQueue(ctx, program.String()); err != nil || q.ProofOfWorkBits != 6 {
			t.Fatalf("client GetQueue = %+v, %v", q, err)
		}
		putQueue(t, a, program, off)
		if v := getRoom(t, a, program); v.PowBits != 0 || v.Checkout != "" {
			t.Errorf("PUT %s: GET shows %+v, want 0 bits and no checkout_url (PUT replaces the room)", off, v)
		}
		buyer := fmt.Sprintf("off%d", i)
		systest.WaitFor(t, 10*time.Second, buyer+" joins without proof on b", func() bool {
			r, _, _ := paJoin(t, b, program, paBody(buyer, "", ""), false)
			return r.Status == http.StatusCreated
		})
	}
	putQueue(t, a, program, paRoom(6, ""))
	opens := int64(0)
	got, err := cl.PutQueue(ctx, program.String(), client.QueueConfig{OpensInSeconds: &opens, RatePerSecond: 20, WindowSeconds: 60, PerRemaining: 1})
	if err != nil || got.ProofOfWorkBits != 0 {
		t.Fatalf("client PutQueue without bits = %+v, %v", got, err)
	}
	got, err = cl.PutQueue(ctx, program.String(), client.QueueConfig{OpensInSeconds: &opens, RatePerSecond: 20, WindowSeconds: 60, PerRemaining: 1, ProofOfWorkBits: 5})
	if err != nil || got.ProofOfWorkBits != 5 {
		t.Fatalf("client PutQueue with 5 bits = %+v, %v", got, err)
	}
	r, _, p := paJoin(t, a, program, paBody("late", "", ""), false)
	paRefused(t, "a join after the client set 5 bits", r, p, "proof-of-work-required", "late")
	if p.Puzzle != nil && p.Puzzle.Difficulty < 5 {
		t.Errorf("difficulty %d, want at least 5", p.Puzzle.Difficulty)
	}
}

// One proof sent at once, many times, to both replicas: one place, one
// 201, every answer the same ticket.
func TestAttackPowSameProofConcurrently(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	a, b := systest.Pair(t, "sqlite")
	program := systest.NewSKU(t).Program
	putQueue(t, a, program, paRoom(4, ""))
	p := paPuzzle(t, a, program, "ann")
	body := paBody("ann", paProof(p.Puzzle.Challenge, paSolveWith(t, p, "")), "")
	var mu sync.Mutex
	created, tickets := 0, map[string]int{}
	var wg sync.WaitGroup
	for i := range 16 {
		e := a
		if i%2 == 1 {
			e = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, q, _ := paJoin(t, e, program, body, false)
			mu.Lock()
			defer mu.Unlock()
			if r.Status == http.StatusCreated {
				created++
			} else if r.Status != http.StatusOK {
				t.Errorf("a concurrent join = %d %s", r.Status, r.Body)
			}
			tickets[q.Ticket]++
		}()
	}
	wg.Wait()
	if created != 1 || len(tickets) != 1 {
		t.Errorf("%d created, tickets %v: want one place", created, tickets)
	}
	if v := getRoom(t, b, program); v.Joined != 1 {
		t.Fatalf("joined %d, want 1", v.Joined)
	}
}

// With every Redis node gone, a room that asks for proof of work still
// answers a join without one with 403 and a puzzle (the puzzle needs no
// Redis), and the solved join with 503, Retry-After and problem+json; no
// other 5xx, and the ledger's facts of the line show nobody placed.
func TestAttackPowWithoutRedis(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	cl := testenv.NewCluster(t, testenv.ClusterOptions{})
	e := systest.Start(t, systest.Options{Driver: "sqlite", Cluster: cl})
	program := systest.NewSKU(t).Program
	putQueue(t, e, program, paRoom(4, ""))
	for _, n := range cl.Nodes {
		n.Kill()
	}
	r, _, p := paJoin(t, e, program, paBody("ann", "", ""), true)
	switch {
	case r.Status == http.StatusForbidden:
		paRefused(t, "a join without proof, Redis gone", r, p, "proof-of-work-required", "ann")
	case r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "":
		t.Logf("a join without proof, Redis gone = 503: %s", r.Body)
	default:
		t.Fatalf("a join without proof, Redis gone = %d %s", r.Status, r.Body)
	}
	if p.Puzzle == nil {
		return
	}
	proof := paProof(p.Puzzle.Challenge, paSolveWith(t, p, ""))
	r, _, _ = paJoin(t, e, program, paBody("ann", proof, ""), true)
	if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Errorf("a solved join, Redis gone = %d %s, want 503 with Retry-After", r.Status, r.Body)
	}
	// A client's mistakes are still 4xx with Redis gone.
	if r, _, _ := paJoin(t, e, program, paBody("ann", paProof(p.Puzzle.Challenge, "not-it-"+strings.Repeat("z", 60)), ""), true); r.Status != http.StatusForbidden {
		t.Errorf("a wrong nonce, Redis gone = %d %s, want 403", r.Status, r.Body)
	}
	if r, _, _ := paJoin(t, e, program, paBody("ann", `"x"`, ""), true); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("a string proof, Redis gone = %d %s, want 422", r.Status, r.Body)
	}
	ln, err := e.Ledger.QueueLine(context.Background(), program)
	if err == nil && (ln.Post != 0 || ln.Early != 0 || ln.Serving != 0) {
		t.Errorf("the ledger's line %+v after joins without Redis", ln)
	}
}

// The purchase door after a proof: a buyer who joined with a solved
// puzzle on one replica is admitted and buys with its admission token on
// the other; a buyer refused for its proof has no token and cannot buy;
// the Go client's JoinQueue solves its own puzzle and its buyer buys too.
func TestAttackPowPurchaseDoor(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	dsn := systest.LedgerDSN(t, "sqlite")
	a := systest.Start(t, systest.Options{Driver: "sqlite", DSN: dsn, Pacer: true})
	b := systest.Start(t, systest.Options{Driver: "sqlite", DSN: dsn, Pacer: true})
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 3, 1, 1)
	putQueue(t, a, sku.Program, paRoom(6, ""))

	p := paPuzzle(t, a, sku.Program, "ann")
	r, q, _ := paJoin(t, a, sku.Program, paBody("ann", paProof(p.Puzzle.Challenge, paSolveWith(t, p, "")), ""), false)
	if r.Status != http.StatusCreated {
		t.Fatalf("ann's join = %d %s", r.Status, r.Body)
	}
	got := untilAdmitted(t, b, sku.Program, q.Ticket, "ann admitted", 20*time.Second)
	if r := buyAdmitted(t, b, sku, "ann-1", "ann", got.Admission); r.Status != http.StatusCreated {
		t.Errorf("ann's purchase with her admission = %d %s", r.Status, r.Body)
	}
	// bob was only refused: no ticket, no token.
	paPuzzle(t, b, sku.Program, "bob")
	if r := b.Do(t, http.MethodPost, systest.SKUPath(sku)+"/purchases", map[string]string{"Idempotency-Key": "bob-1"}, `{"buyer":"bob","quantity":1}`); r.Status != http.StatusForbidden || systest.ProblemKind(r) != "admission-required" {
		t.Errorf("bob's purchase without admission = %d %s", r.Status, r.Body)
	}
	if r := buyAdmitted(t, b, sku, "bob-2", "bob", got.Admission); r.Status != http.StatusForbidden {
		t.Errorf("bob's purchase with ann's admission = %d %s", r.Status, r.Body)
	}

	cl, err := client.New(client.Options{BaseURL: b.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	st, err := cl.JoinQueue(ctx, sku.Program.String(), "cy")
	if err != nil || st.Ticket == "" {
		t.Fatalf("the client's join = %+v, %v", st, err)
	}
	systest.WaitFor(t, 20*time.Second, "cy admitted", func() bool {
		st, err = cl.CheckQueue(ctx, sku.Program.String(), st.Ticket)
		return err == nil && st.State == "admitted"
	})
	o, err := cl.Admitted(st.AdmissionToken).Purchase(ctx, client.SKU{Program: sku.Program.String(), Ticket: sku.Ticket.String()}, "cy-1", "cy", 1)
	if err != nil || o.Quantity != 1 {
		t.Errorf("cy's purchase through the client = %+v, %v", o, err)
	}
	if s := a.State(t, sku); s.Sold != 2 {
		t.Errorf("sold %d, want 2 (ann and cy)", s.Sold)
	}
}

// The Go client: JoinQueue on a room asking none joins at once; its
// solving stops with ctx (nobody placed); before join_from it returns the
// 409 without solving anything; on a program with no room, the 404.
func TestAttackPowClient(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	e := systest.New(t, "sqlite")
	hard, none, early, noRoom := systest.NewSKU(t).Program, systest.NewSKU(t).Program, systest.NewSKU(t).Program, systest.NewSKU(t).Program
	putQueue(t, e, hard, paRoom(24, ""))
	putQueue(t, e, none, paRoom(0, ""))
	putQueue(t, e, early, fmt.Sprintf(`{"opens_at":%q,"rate_per_second":10,"window_seconds":60,"per_remaining":1,"proof_of_work_bits":4}`,
		time.Now().Add(time.Hour).UTC().Format(time.RFC3339)))
	cl, err := client.New(client.Options{BaseURL: e.URL})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := cl.JoinQueue(t.Context(), none.String(), "ann"); err != nil || st.Ticket == "" {
		t.Errorf("JoinQueue on a room asking none = %+v, %v", st, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = cl.JoinQueue(ctx, hard.String(), "ann")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("JoinQueue of a 24-bit puzzle cut at 100 ms = %v, want the deadline", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("JoinQueue gave up after %v", took)
	}
	if v := getRoom(t, e, hard); v.Joined != 0 {
		t.Errorf("joined %d", v.Joined)
	}
	_, err = cl.JoinQueue(t.Context(), early.String(), "ann")
	var p *client.Problem
	if !errors.As(err, &p) || p.Status != http.StatusConflict || p.Puzzle != nil {
		t.Errorf("JoinQueue before join_from = %v, want the 409", err)
	}
	_, err = cl.JoinQueue(t.Context(), noRoom.String(), "ann")
	if !errors.As(err, &p) || p.Status != http.StatusNotFound {
		t.Errorf("JoinQueue with no room = %v, want the 404", err)
	}
}

// X-Forwarded-For (and X-Real-IP) from a client the gateway does not
// trust (none, by default) does not split a burst into networks: 100
// solved joins, each claiming another address, still make the puzzles
// harder.
func TestAttackPowForwardedForIgnored(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	e := systest.New(t, "sqlite")
	program := systest.NewSKU(t).Program
	putQueue(t, e, program, paRoom(4, ""))
	path := "/v1/programs/" + program.String() + "/queue"
	most := 0
	for i := range 100 {
		forged := map[string]string{"X-Forwarded-For": fmt.Sprintf("198.%d.%d.7", i/250, i%250), "X-Real-IP": fmt.Sprintf("203.0.%d.9", i)}
		buyer := fmt.Sprintf("bot%d", i)
		r := e.Do(t, http.MethodPost, path, forged, paBody(buyer, "", ""))
		var p powProblem
		if err := json.Unmarshal(r.Body, &p); err != nil || p.Puzzle == nil {
			t.Fatalf("%s = %d %s", buyer, r.Status, r.Body)
		}
		most = max(most, p.Puzzle.Difficulty)
		if r := e.Do(t, http.MethodPost, path, forged, paBody(buyer, paProof(p.Puzzle.Challenge, paSolveWith(t, p, "")), "")); r.Status != http.StatusCreated {
			t.Fatalf("%s with its proof = %d %s", buyer, r.Status, r.Body)
		}
	}
	if most < 6 {
		t.Errorf("100 solved joins with forged X-Forwarded-For: hardest puzzle %d bits, want at least 6", most)
	}
}

// docsNsPerHash is the Go solver's cost per try that docs/API.md gives
// ("about 166 ns each in Go on one core"), the fastest solver it names.
const docsNsPerHash = 166

// A room may ask 24 bits, and a network's join rate adds up to 8, on a
// puzzle that lasts 2 minutes. Joins without any proof count toward that
// rate, so anyone in a /24 (behind a proxy the gateway trusts, as the
// docs ask) raises every neighbour's puzzles for free; at 24 bits, 1,025
// such joins in 10 s make the next neighbour's puzzle 30 bits: 2^30 tries
// at the documented 166 ns each is 178 s, past its 120 s of life, on the
// fastest solver the docs name (a phone, "20 bits about a second", needs
// over 17 minutes). The gateway must not hand out a puzzle the buyer
// cannot be expected to solve before it expires.
func TestAttackPowPuzzleOutlivesItsLife(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	e := systest.Start(t, systest.Options{Driver: "sqlite", Tune: func(o *app.Options) {
		o.HTTP.TrustedProxies = []string{"127.0.0.1", "::1"}
	}})
	program := systest.NewSKU(t).Program
	putQueue(t, e, program, paRoom(24, ""))
	path := e.URL + "/v1/programs/" + program.String() + "/queue"
	// The neighbours' flood: proofless joins from 10.9.8.0/24, no work.
	flood := func(n int) {
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 8 {
					req, _ := http.NewRequest(http.MethodPost, path, strings.NewReader(fmt.Sprintf(`{"buyer":"bot%d"}`, i)))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Forwarded-For", fmt.Sprintf("10.9.8.%d", 1+i%250))
					resp, err := e.Client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusForbidden {
						t.Errorf("a flood join = %d", resp.StatusCode)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	victim := func() (int, time.Duration) {
		r := e.Do(t, http.MethodPost, "/v1/programs/"+program.String()+"/queue", map[string]string{"X-Forwarded-For": "10.9.8.77"}, `{"buyer":"neighbour"}`)
		var p powProblem
		if err := json.Unmarshal(r.Body, &p); err != nil || p.Puzzle == nil {
			t.Fatalf("the neighbour's join = %d %s", r.Status, r.Body)
		}
		return p.Puzzle.Difficulty, time.Until(p.Puzzle.ExpiresAt)
	}
	if d, _ := victim(); d != 24 {
		t.Fatalf("the neighbour's first puzzle: %d bits, want 24", d)
	}
	start := time.Now()
	flood(1100)
	took := time.Since(start)
	d, life := victim()
	need := time.Duration(math.Pow(2, float64(d)) * docsNsPerHash)
	t.Logf("1,100 proofless joins from the /24 in %v; the neighbour's puzzle: %d bits, %v of life, %v of expected work at %d ns a try",
		took.Round(time.Millisecond), d, life.Round(time.Second), need.Round(time.Second), docsNsPerHash)
	// Proofless joins count for nothing, however fast they came: the
	// neighbour's puzzle is the room's own.
	if d != 24 {
		t.Errorf("after 1,100 proofless joins from its /24 the neighbour's puzzle asks %d bits, want the room's 24", d)
	}
	if need > life {
		t.Errorf("the neighbour's puzzle asks %d bits: %v of expected work on the docs' fastest solver, past its %v of life; "+
			"1,100 joins without proof (no work) from its /24 did it", d, need.Round(time.Second), life.Round(time.Second))
	}
}

// The setting on a PostgreSQL ledger (the other tests use SQLite): PUT,
// GET, the puzzle's difficulty on the other replica, a solved join, the
// setting turned off by a PUT without it, and a room made again refusing
// the old room's proof.
func TestAttackPowOnPostgres(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	a, b := systest.Pair(t, "postgres")
	program := systest.NewSKU(t).Program
	putQueue(t, a, program, paRoom(7, ""))
	if v := getRoom(t, a, program); v.PowBits != 7 {
		t.Fatalf("GET shows %d bits, want 7", v.PowBits)
	}
	p := paPuzzle(t, b, program, "ann")
	if p.Puzzle.Difficulty != 7 {
		t.Errorf("difficulty %d on b, want 7", p.Puzzle.Difficulty)
	}
	proof := paProof(p.Puzzle.Challenge, paSolveWith(t, p, ""))
	if r, _, _ := paJoin(t, b, program, paBody("ann", proof, ""), false); r.Status != http.StatusCreated {
		t.Fatalf("ann's join = %d %s", r.Status, r.Body)
	}
	if r := a.Do(t, http.MethodDelete, "/v1/admin/programs/"+program.String()+"/queue", nil, ""); r.Status != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", r.Status, r.Body)
	}
	putQueue(t, a, program, paRoom(7, ""))
	r, _, pp := paJoin(t, a, program, paBody("ann", proof, ""), false)
	paRefused(t, "the old room's proof", r, pp, "proof-of-work-invalid", "ann")
	putQueue(t, a, program, paRoom(-1, ""))
	if v := getRoom(t, a, program); v.PowBits != 0 || v.Joined != 0 {
		t.Fatalf("after a PUT without the field: %+v, want 0 bits and nobody", v)
	}
	if r, _, _ := paJoin(t, a, program, paBody("bob", "", ""), false); r.Status != http.StatusCreated {
		t.Errorf("bob without proof once off = %d %s", r.Status, r.Body)
	}
}

// The page of a room that asks for proof of work, and its worker: both
// served as documented (the worker as JavaScript the page's CSP lets it
// start).
func TestAttackPowPageAndWorker(t *testing.T) {
	systest.FullTier(t)
	t.Parallel()
	e := systest.New(t, "sqlite")
	program := systest.NewSKU(t).Program
	putQueue(t, e, program, paRoom(8, ""))
	r := e.Do(t, http.MethodGet, "/queue/"+program.String()+"?buyer=ann", nil, "")
	if r.Status != http.StatusOK || !strings.Contains(r.Header.Get("Content-Security-Policy"), "worker-src 'self'") ||
		!strings.Contains(string(r.Body), "/queue-worker.js") {
		t.Errorf("the page = %d %v", r.Status, r.Header)
	}
	w := e.Do(t, http.MethodGet, "/queue-worker.js", nil, "")
	if w.Status != http.StatusOK || !strings.HasPrefix(w.Header.Get("Content-Type"), "text/javascript") || !strings.Contains(string(w.Body), "onmessage") {
		t.Errorf("the worker = %d %v", w.Status, w.Header)
	}
	if v := getRoom(t, e, program); v.Joined != 0 {
		t.Errorf("the page placed %d", v.Joined)
	}
}
