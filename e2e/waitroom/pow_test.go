package waitroom_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/e2e/systest"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/waitroom"
)

// powProblem is a join refused for its proof of work.
type powProblem struct {
	Type   string `json:"type"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Puzzle *struct {
		Challenge  string    `json:"challenge"`
		Difficulty int       `json:"difficulty"`
		Algorithm  string    `json:"algorithm"`
		ExpiresAt  time.Time `json:"expires_at"`
	} `json:"puzzle"`
}

// powJoin joins buyer with proof (nil: none) and returns the answer and,
// on a refusal, its problem.
func powJoin(t *testing.T, e *systest.Env, program keys.ID, buyer string, proof map[string]string) (systest.Reply, queueReply, powProblem) {
	t.Helper()
	body := map[string]any{"buyer": buyer}
	if proof != nil {
		body["proof"] = proof
	}
	b, _ := json.Marshal(body)
	r, q := qaJoinWith(t, e, program, string(b))
	var p powProblem
	if r.Status >= 400 {
		if err := json.Unmarshal(r.Body, &p); err != nil {
			t.Fatalf("join %s = %d %s: %v", buyer, r.Status, r.Body, err)
		}
	}
	return r, q, p
}

// solve solves a refused join's puzzle as a client does.
func solve(t *testing.T, p powProblem) map[string]string {
	t.Helper()
	if p.Puzzle == nil {
		t.Fatalf("no puzzle in %+v", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nonce, err := waitroom.Solve(ctx, waitroom.Puzzle{Challenge: p.Puzzle.Challenge, Bits: p.Puzzle.Difficulty})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{"challenge": p.Puzzle.Challenge, "nonce": nonce}
}

// A room that asks for proof of work refuses a join without one with 403
// and a puzzle, and places nobody; the solved puzzle lets its buyer join
// on either replica (nothing is stored), and join again; it lets no other
// buyer in, nor a wrong nonce. A network that joins fast gets harder
// puzzles. The setting is validated, shown, and turned off again.
func TestQueueProofOfWork(t *testing.T) {
	t.Parallel() // its own replicas and program
	a, b := systest.Pair(t, "sqlite")
	sku := systest.NewSKU(t)
	a.PutSKU(t, sku, 5, 1, 1)
	program := sku.Program
	for _, bits := range []string{"-1", "25", "1.5", `"8"`} {
		r := a.Do(t, http.MethodPut, "/v1/admin/programs/"+program.String()+"/queue", nil,
			fmt.Sprintf(`{"opens_in_seconds":0,"rate_per_second":10,"window_seconds":60,"per_remaining":1,"proof_of_work_bits":%s}`, bits))
		if r.Status != http.StatusUnprocessableEntity && r.Status != http.StatusBadRequest {
			t.Errorf("proof_of_work_bits %s = %d %s, want 4xx", bits, r.Status, r.Body)
		}
	}
	putQueue(t, a, program, `{"opens_in_seconds":0,"rate_per_second":10,"window_seconds":60,"per_remaining":1,"proof_of_work_bits":8}`)
	if r := a.Do(t, http.MethodGet, "/v1/admin/programs/"+program.String()+"/queue", nil, ""); !strings.Contains(string(r.Body), `"proof_of_work_bits":8`) {
		t.Fatalf("GET queue = %d %s", r.Status, r.Body)
	}

	r, _, p := powJoin(t, a, program, "ann", nil)
	if r.Status != http.StatusForbidden || systest.ProblemKind(r) != "proof-of-work-required" || p.Puzzle == nil ||
		p.Puzzle.Difficulty != 8 || p.Puzzle.Algorithm != "sha-256-leading-zero-bits" || !p.Puzzle.ExpiresAt.After(time.Now()) {
		t.Fatalf("join without proof = %d %s", r.Status, r.Body)
	}
	if got := r.Header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("content type %q", got)
	}
	annProof := solve(t, p)

	// ann's solution on bob's join, and a nonce that does not solve it:
	// refused with a new puzzle for the one asking.
	r, _, p = powJoin(t, a, program, "bob", annProof)
	if r.Status != http.StatusForbidden || systest.ProblemKind(r) != "proof-of-work-invalid" || p.Puzzle == nil ||
		!strings.Contains(p.Puzzle.Challenge, ".bob.") {
		t.Fatalf("bob with ann's proof = %d %s", r.Status, r.Body)
	}
	wrong := map[string]string{"challenge": annProof["challenge"], "nonce": annProof["nonce"] + "x"}
	for n := 0; n < 1000 && leading(wrong) >= 8; n++ {
		wrong["nonce"] = fmt.Sprintf("x%d", n)
	}
	if r, _, _ := powJoin(t, a, program, "ann", wrong); r.Status != http.StatusForbidden || systest.ProblemKind(r) != "proof-of-work-invalid" {
		t.Fatalf("a wrong nonce = %d %s", r.Status, r.Body)
	}
	if v := getRoom(t, a, program); v.Joined != 0 {
		t.Fatalf("refused joins placed %d buyers", v.Joined)
	}

	// Solved: ann joins on the other replica, and again on the first.
	r, q, _ := powJoin(t, b, program, "ann", annProof)
	if r.Status != http.StatusCreated || q.Ticket == "" {
		t.Fatalf("ann with her proof on b = %d %s", r.Status, r.Body)
	}
	if r2, q2, _ := powJoin(t, a, program, "ann", annProof); r2.Status != http.StatusOK || q2.Ticket != q.Ticket {
		t.Fatalf("ann again on a = %d %s", r2.Status, r2.Body)
	}
	if v := getRoom(t, a, program); v.Joined != 1 {
		t.Fatalf("joined %d, want 1", v.Joined)
	}
	// The Go client solves the puzzle itself.
	cl, err := client.New(client.Options{BaseURL: b.URL})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := cl.JoinQueue(t.Context(), program.String(), "dan"); err != nil || st.Ticket == "" {
		t.Fatalf("the client's join = %+v, %v", st, err)
	}

	// Asking for puzzles costs nothing, so it raises nobody's difficulty.
	var early powProblem
	for i := range 100 {
		_, _, p := powJoin(t, a, program, fmt.Sprintf("asker%d", i), nil)
		if p.Puzzle == nil || p.Puzzle.Difficulty != 8 {
			t.Fatalf("asker%d's puzzle = %+v", i, p.Puzzle)
		}
		if i == 0 {
			early = p
		}
	}
	// A burst of joins that did the work, from one network (this test's
	// loopback): the puzzles get harder, one bit per doubling past the
	// free joins.
	most := 0
	for i := range 100 {
		buyer := fmt.Sprintf("bot%d", i)
		_, _, p := powJoin(t, a, program, buyer, nil)
		most = max(most, p.Puzzle.Difficulty)
		if r, _, _ := powJoin(t, a, program, buyer, solve(t, p)); r.Status != http.StatusCreated {
			t.Fatalf("%s with its proof = %d %s", buyer, r.Status, r.Body)
		}
	}
	if most < 10 {
		t.Errorf("100 solved joins in a row from one network: hardest puzzle %d bits, want at least 10", most)
	}
	// A solution is good on every replica for as long as its puzzle
	// lasts, so a puzzle asked for before a burst keeps its difficulty:
	// the rate prices the puzzles asked for during it (helper-51 showed
	// the price can be dodged by asking early; judging at the join made
	// one proof good on one replica and refused on another, helper-52).
	if r, _, _ := powJoin(t, b, program, "asker0", solve(t, early)); r.Status != http.StatusCreated {
		t.Errorf("a puzzle asked for before the burst, joined on the other replica after it = %d %s, want 201", r.Status, r.Body)
	}

	// Off again: a join needs nothing.
	putQueue(t, a, program, `{"opens_in_seconds":0,"rate_per_second":10,"window_seconds":60,"per_remaining":1,"proof_of_work_bits":0}`)
	systest.WaitFor(t, 10*time.Second, "cy joins without a proof once the setting is off on b", func() bool {
		r, _, _ := powJoin(t, b, program, "cy", nil)
		return r.Status == http.StatusCreated
	})
}

// leading is the leading zero bits of a proof's hash.
func leading(p map[string]string) int {
	c := waitroom.Puzzle{Challenge: p["challenge"], Bits: 0}
	for bits := 1; bits <= 32; bits++ {
		c.Bits = bits
		if !waitroom.Solves(c, p["nonce"]) {
			return bits - 1
		}
	}
	return 32
}
