package client

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/bits"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// QueueStatus is where a buyer stands in a program's waiting room.
type QueueStatus struct {
	Program string `json:"program"`
	Buyer   string `json:"buyer"`
	// Ticket is the signed queue ticket to check with (CheckQueue).
	Ticket string `json:"ticket"`
	// State: waiting, admitted (AdmissionToken lets one order through:
	// Admitted), sold-out, or expired (admitted, and the window
	// passed).
	State             string    `json:"state"`
	Position          int64     `json:"position,omitempty"`
	Ahead             int64     `json:"ahead,omitempty"`
	WaitSeconds       int64     `json:"estimated_wait_seconds"`
	AdmissionToken    string    `json:"admission_token,omitempty"`
	OpensAt           time.Time `json:"opens_at"`
	RetryAfterSeconds int64     `json:"retry_after_seconds,omitempty"`
	// AsOf is when the answering replica read the line: within a
	// quarter second of the answer unless a reload was slow (Redis or the
	// ledger struggling).
	AsOf time.Time `json:"as_of"`
}

// QueueConfig is a program's waiting room (admin).
type QueueConfig struct {
	OpensAt        *time.Time `json:"opens_at,omitempty"`
	OpensInSeconds *int64     `json:"opens_in_seconds,omitempty"`
	JoinFrom       *time.Time `json:"join_from,omitempty"`
	RatePerSecond  int64      `json:"rate_per_second"`
	WindowSeconds  int64      `json:"window_seconds"`
	PerRemaining   float64    `json:"per_remaining"`
	// CheckoutURL is where the waiting room's page sends an admitted buyer.
	CheckoutURL string `json:"checkout_url,omitempty"`
	// ProofOfWorkBits, when not 0, makes every join bring a solved puzzle
	// of at least this many bits (1..24). A PUT replaces every setting.
	ProofOfWorkBits int64 `json:"proof_of_work_bits,omitempty"`
	// SoldOutShare is the share of admitted buyers the pacer may let meet
	// sold out (0..0.5; nil: 0.05). 0 admits no more than PerRemaining
	// per ticket left.
	SoldOutShare *float64 `json:"sold_out_share,omitempty"`
}

// Queue is a waiting room and its line (admin).
type Queue struct {
	Program         string    `json:"program"`
	OpensAt         time.Time `json:"opens_at"`
	JoinFrom        time.Time `json:"join_from"`
	RatePerSecond   int64     `json:"rate_per_second"`
	WindowSeconds   int64     `json:"window_seconds"`
	PerRemaining    float64   `json:"per_remaining"`
	CheckoutURL     string    `json:"checkout_url,omitempty"`
	ProofOfWorkBits int64     `json:"proof_of_work_bits"`
	SoldOutShare    float64   `json:"sold_out_share"`
	Conversion      float64   `json:"conversion"`
	Opened          bool      `json:"opened"`
	Joined          int64     `json:"joined"`
	Serving         int64     `json:"serving"`
	AdmittedUnused  int64     `json:"admitted_unused"`
	Abandoned       int64     `json:"abandoned"`
	SoldOut         bool      `json:"sold_out"`
}

// PutQueue turns a program's waiting room on, or changes it (admin).
func (c *Client) PutQueue(ctx context.Context, program string, q QueueConfig) (Queue, error) {
	var out Queue
	_, err := c.call(ctx, http.MethodPut, "/v1/admin/programs/"+url.PathEscape(program)+"/queue", "", true, q, &out)
	return out, err
}

// GetQueue reads a program's waiting room and its line (admin).
func (c *Client) GetQueue(ctx context.Context, program string) (Queue, error) {
	var out Queue
	_, err := c.call(ctx, http.MethodGet, "/v1/admin/programs/"+url.PathEscape(program)+"/queue", "", true, nil, &out)
	return out, err
}

// DeleteQueue turns a program's waiting room off (admin).
func (c *Client) DeleteQueue(ctx context.Context, program string) error {
	_, err := c.call(ctx, http.MethodDelete, "/v1/admin/programs/"+url.PathEscape(program)+"/queue", "", true, nil, nil)
	return err
}

// JoinQueue gives buyer its one place in program's waiting room (again:
// the same place) and the ticket to check it with. A room that asks for
// proof of work answers with a puzzle, which JoinQueue solves (on this
// goroutine: 2^difficulty hashes on average) and joins again with.
func (c *Client) JoinQueue(ctx context.Context, program, buyer string) (QueueStatus, error) {
	return c.join(ctx, program, map[string]any{"buyer": buyer})
}

// RejoinQueue is JoinQueue presenting the ticket of buyer's earlier join:
// the place is kept even if the line's record was lost.
func (c *Client) RejoinQueue(ctx context.Context, program, buyer, ticket string) (QueueStatus, error) {
	return c.join(ctx, program, map[string]any{"buyer": buyer, "ticket": ticket})
}

func (c *Client) join(ctx context.Context, program string, body map[string]any) (QueueStatus, error) {
	var out QueueStatus
	path := "/v1/programs/" + url.PathEscape(program) + "/queue"
	_, err := c.call(ctx, http.MethodPost, path, "", false, body, &out)
	// A puzzle, solved, is good for one more try: a second refusal (the
	// room asked for more meanwhile) is the caller's to see.
	var p *Problem
	if !errors.As(err, &p) || p.Puzzle == nil {
		return out, err
	}
	nonce, err := SolvePuzzle(ctx, *p.Puzzle)
	if err != nil {
		return out, err
	}
	body["proof"] = map[string]string{"challenge": p.Puzzle.Challenge, "nonce": nonce}
	_, err = c.call(ctx, http.MethodPost, path, "", false, body, &out)
	return out, err
}

// SolvePuzzle finds a nonce for a waiting room's proof-of-work puzzle by
// counting, as the waiting room's page does; it gives up when ctx is done.
func SolvePuzzle(ctx context.Context, pz Puzzle) (string, error) {
	if pz.Difficulty < 0 || pz.Difficulty > 64 {
		return "", fmt.Errorf("client: puzzle difficulty %d out of range", pz.Difficulty)
	}
	buf := []byte(pz.Challenge + ":")
	n := len(buf)
	for i := uint64(0); ; i++ {
		if i&0xffff == 0 && ctx.Err() != nil {
			return "", ctx.Err()
		}
		buf = strconv.AppendUint(buf[:n], i, 10)
		if sum := sha256.Sum256(buf); leadingZeros(sum[:]) >= pz.Difficulty {
			return string(buf[n:]), nil
		}
	}
}

func leadingZeros(b []byte) int {
	z := 0
	for _, x := range b {
		if x != 0 {
			return z + bits.LeadingZeros8(x)
		}
		z += 8
	}
	return z
}

// CheckQueue reads where the holder of ticket stands.
func (c *Client) CheckQueue(ctx context.Context, program, ticket string) (QueueStatus, error) {
	var out QueueStatus
	_, err := c.call(ctx, http.MethodGet, "/v1/programs/"+url.PathEscape(program)+"/queue/"+url.PathEscape(ticket), "", false, nil, &out)
	return out, err
}

// Admitted returns a Client like c whose requests carry token, the
// waiting room's admission (the Admission-Token header): the buyer's
// purchases, holds and carts in a program sold through its waiting room.
// It is a copy; c is unchanged.
func (c *Client) Admitted(token string) *Client {
	d := *c
	d.admission = token
	return &d
}

// ForDevice returns a Client like c whose requests carry the buyer's
// device or payment fingerprint (the Buyer-Fingerprint header), counted
// against its program's device hold budget. It is a copy; c is unchanged.
func (c *Client) ForDevice(fingerprint string) *Client {
	d := *c
	d.fingerprint = fingerprint
	return &d
}
