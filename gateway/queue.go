package gateway

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/waitroom"
)

// queueBody is a program's waiting room as admin sets it.
type queueBody struct {
	OpensAt        *time.Time `json:"opens_at"`
	JoinFrom       *time.Time `json:"join_from"`
	RatePerSecond  *int64     `json:"rate_per_second"`
	WindowSeconds  *int64     `json:"window_seconds"`
	PerRemaining   *float64   `json:"per_remaining"`
	OpensInSeconds *int64     `json:"opens_in_seconds"` // instead of opens_at: from now
	CheckoutURL    string     `json:"checkout_url"`
	// ProofOfWorkBits, when given and not 0, makes every join bring a
	// solved puzzle of at least this many bits.
	ProofOfWorkBits *int64 `json:"proof_of_work_bits"`
	// SoldOutShare is the share of admitted buyers the pacer may let meet
	// sold out (0..0.5; default 0.05).
	SoldOutShare *float64 `json:"sold_out_share"`
}

// queueView is a waiting room and its line, for admin.
type queueView struct {
	Program       string    `json:"program"`
	OpensAt       time.Time `json:"opens_at"`
	JoinFrom      time.Time `json:"join_from"`
	RatePerSecond int64     `json:"rate_per_second"`
	WindowSeconds int64     `json:"window_seconds"`
	PerRemaining  float64   `json:"per_remaining"`
	CheckoutURL   string    `json:"checkout_url,omitempty"`
	PowBits       int       `json:"proof_of_work_bits"`
	SoldOutShare  float64   `json:"sold_out_share"`
	Conversion    float64   `json:"conversion"`
	Opened        bool      `json:"opened"`
	Joined        int64     `json:"joined"`
	Serving       int64     `json:"serving"`
	Unused        int64     `json:"admitted_unused"`
	Abandoned     int64     `json:"abandoned"`
	SoldOut       bool      `json:"sold_out"`
}

func queueViewOf(c waitroom.Config) queueView {
	return queueView{Program: c.Program.String(), OpensAt: c.OpensAt.UTC(), JoinFrom: c.JoinFrom.UTC(), RatePerSecond: c.Rate,
		WindowSeconds: int64(c.Window / time.Second), PerRemaining: c.PerRemaining, CheckoutURL: c.CheckoutURL, PowBits: c.PowBits, SoldOutShare: c.SoldOutShare}
}

// programParam parses the :program of the path.
func programParam(c *gin.Context) (keys.ID, bool) {
	program, err := keys.ParseID(c.Param("program"))
	if err != nil {
		writeProblem(c, http.StatusBadRequest, "invalid-id", "program ids match [A-Za-z0-9_-]{1,64}", 0)
		return program, false
	}
	return program, true
}

// putQueue handles PUT /v1/admin/programs/:program/queue: the program's
// purchases, holds and carts go through its waiting room from now on.
func (s *Server) putQueue(c *gin.Context) {
	program, ok := programParam(c)
	if !ok {
		return
	}
	var b queueBody
	if !s.decodeBody(c, &b) {
		return
	}
	if detail := b.invalid(); detail != "" {
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", detail, 0)
		return
	}
	cfg := waitroom.Config{Program: program, Rate: *b.RatePerSecond, Window: time.Duration(*b.WindowSeconds) * time.Second,
		PerRemaining: *b.PerRemaining, CheckoutURL: b.CheckoutURL}
	if b.ProofOfWorkBits != nil {
		cfg.PowBits = int(*b.ProofOfWorkBits)
	}
	cfg.SoldOutShare = waitroom.DefaultSoldOutShare
	if b.SoldOutShare != nil {
		cfg.SoldOutShare = *b.SoldOutShare
	}
	if b.OpensAt != nil {
		cfg.OpensAt = *b.OpensAt
	} else {
		cfg.OpensAt = time.Now().Add(time.Duration(*b.OpensInSeconds) * time.Second)
	}
	if b.JoinFrom != nil {
		cfg.JoinFrom = *b.JoinFrom
	}
	got, err := s.rooms.Put(c.Request.Context(), cfg)
	if err != nil {
		s.roomError(c, err)
		return
	}
	c.JSON(http.StatusOK, queueViewOf(got))
}

// invalid is what is wrong with a waiting room's settings, or "".
func (b queueBody) invalid() string {
	switch {
	case (b.OpensAt == nil) == (b.OpensInSeconds == nil):
		return "give opens_at (RFC 3339) or opens_in_seconds"
	case b.RatePerSecond == nil || b.WindowSeconds == nil || b.PerRemaining == nil:
		return "rate_per_second, window_seconds and per_remaining are required"
	case b.OpensInSeconds != nil && (*b.OpensInSeconds < 0 || *b.OpensInSeconds > 366*86400):
		return "opens_in_seconds must be 0..31622400"
	case *b.WindowSeconds < 1 || *b.WindowSeconds > 86400:
		return "window_seconds must be 1..86400"
	case math.IsNaN(*b.PerRemaining) || *b.PerRemaining < 0.001 || *b.PerRemaining > 1000:
		return "per_remaining must be 0.001..1000"
	case b.SoldOutShare != nil && (math.IsNaN(*b.SoldOutShare) || *b.SoldOutShare < 0 || *b.SoldOutShare > 0.5):
		return "sold_out_share must be 0..0.5"
	case b.ProofOfWorkBits != nil && (*b.ProofOfWorkBits < 0 || *b.ProofOfWorkBits > waitroom.MaxPowBits):
		return fmt.Sprintf("proof_of_work_bits must be 0..%d", waitroom.MaxPowBits)
	}
	return ""
}

// getQueue handles GET /v1/admin/programs/:program/queue.
func (s *Server) getQueue(c *gin.Context) {
	program, ok := programParam(c)
	if !ok {
		return
	}
	v, err := s.rooms.Get(c.Request.Context(), program)
	if err != nil {
		s.roomError(c, err)
		return
	}
	out := queueViewOf(v.Config)
	out.Opened, out.Joined, out.Serving, out.Unused, out.Abandoned, out.SoldOut = v.Opened, v.Joined, v.Serving, v.Unused, v.Abandoned, v.SoldOut
	out.Conversion = math.Round(v.Conversion*1000) / 1000
	c.JSON(http.StatusOK, out)
}

// deleteQueue handles DELETE /v1/admin/programs/:program/queue.
func (s *Server) deleteQueue(c *gin.Context) {
	program, ok := programParam(c)
	if !ok {
		return
	}
	if err := s.rooms.Delete(c.Request.Context(), program); err != nil {
		s.roomError(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

// queueStatusView is where a buyer stands, as the API shows it.
type queueStatusView struct {
	Program           string    `json:"program"`
	Buyer             string    `json:"buyer"`
	Ticket            string    `json:"ticket"`
	State             string    `json:"state"`
	Position          int64     `json:"position,omitempty"`
	Ahead             *int64    `json:"ahead,omitempty"`
	WaitSeconds       int64     `json:"estimated_wait_seconds"`
	AdmissionToken    string    `json:"admission_token,omitempty"`
	OpensAt           time.Time `json:"opens_at"`
	RetryAfterSeconds int64     `json:"retry_after_seconds,omitempty"`
	AsOf              time.Time `json:"as_of"`
}

func queueStatusViewOf(st waitroom.Status) queueStatusView {
	v := queueStatusView{Program: st.Program.String(), Buyer: st.Buyer.String(), Ticket: st.Ticket, State: st.State,
		Position: st.Position, WaitSeconds: int64(max(st.Wait, 0) / time.Second), AdmissionToken: st.Admission, OpensAt: st.OpensAt.UTC(),
		AsOf: st.AsOf.UTC()}
	if st.State == waitroom.Waiting && st.Position > 0 {
		ahead := st.Ahead
		v.Ahead = &ahead
	}
	if st.RetryAfter > 0 {
		v.RetryAfterSeconds = int64((st.RetryAfter + time.Second - 1) / time.Second)
	}
	return v
}

func (s *Server) writeQueueStatus(c *gin.Context, status int, st waitroom.Status) {
	v := queueStatusViewOf(st)
	if v.RetryAfterSeconds > 0 {
		c.Header("Retry-After", strconv.FormatInt(v.RetryAfterSeconds, 10))
	}
	c.Data(status, "application/json; charset=utf-8", v.appendJSON(make([]byte, 0, 512)))
}

// appendJSON is v as encoding/json writes it, appended by hand: checks are
// the waiting room's flood, and reflection was a tenth of their cost.
// TestQueueStatusJSON holds it to encoding/json's output.
func (v queueStatusView) appendJSON(b []byte) []byte {
	b = append(b, `{"program":`...)
	b = appendJSONString(b, v.Program)
	b = append(b, `,"buyer":`...)
	b = appendJSONString(b, v.Buyer)
	b = append(b, `,"ticket":`...)
	b = appendJSONString(b, v.Ticket)
	b = append(b, `,"state":`...)
	b = appendJSONString(b, v.State)
	if v.Position != 0 {
		b = append(b, `,"position":`...)
		b = strconv.AppendInt(b, v.Position, 10)
	}
	if v.Ahead != nil {
		b = append(b, `,"ahead":`...)
		b = strconv.AppendInt(b, *v.Ahead, 10)
	}
	b = append(b, `,"estimated_wait_seconds":`...)
	b = strconv.AppendInt(b, v.WaitSeconds, 10)
	if v.AdmissionToken != "" {
		b = append(b, `,"admission_token":`...)
		b = appendJSONString(b, v.AdmissionToken)
	}
	b = append(b, `,"opens_at":"`...)
	b = v.OpensAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if v.RetryAfterSeconds != 0 {
		b = append(b, `,"retry_after_seconds":`...)
		b = strconv.AppendInt(b, v.RetryAfterSeconds, 10)
	}
	b = append(b, `,"as_of":"`...)
	b = v.AsOf.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}

// appendJSONString appends s as a JSON string: as it is when it needs no
// escaping (ids and signed tickets never do), else as encoding/json
// escapes it.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// joinBody is a buyer joining a line; Ticket, optional, is the ticket of
// the buyer's earlier join (its place is kept even if Redis lost it);
// Proof the solved puzzle of a room that asks for proof of work.
type joinBody struct {
	Buyer  string     `json:"buyer"`
	Ticket string     `json:"ticket"`
	Proof  *joinProof `json:"proof"`
}

type joinProof struct {
	Challenge string `json:"challenge"`
	Nonce     string `json:"nonce"`
}

// joinQueue handles POST /v1/programs/:program/queue {"buyer": ...,
// "ticket"?: ...}: 201 with the buyer's new place and ticket, 200 with the
// one it has.
func (s *Server) joinQueue(c *gin.Context) {
	program, ok := programParam(c)
	if !ok {
		return
	}
	var body joinBody
	if !s.decodeBody(c, &body) {
		return
	}
	buyer, ok := buyerField(c, body.Buyer)
	if !ok {
		return
	}
	ask := waitroom.JoinAsk{Buyer: buyer, Ticket: body.Ticket, Client: c.ClientIP()}
	if body.Proof != nil {
		ask.Proof = waitroom.Proof{Challenge: body.Proof.Challenge, Nonce: body.Proof.Nonce}
	}
	st, created, err := s.rooms.Join(c.Request.Context(), program, ask)
	if err != nil {
		s.roomError(c, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	s.writeQueueStatus(c, status, st)
}

// checkQueue handles GET /v1/programs/:program/queue/:ticket: where the
// ticket's holder stands, answered from memory.
func (s *Server) checkQueue(c *gin.Context) {
	program, ok := programParam(c)
	if !ok {
		return
	}
	st, err := s.rooms.Check(c.Request.Context(), program, c.Param("ticket"))
	if err != nil {
		s.roomError(c, err)
		return
	}
	s.writeQueueStatus(c, http.StatusOK, st)
}

//go:embed page/queue.html
var queuePage string

//go:embed page/pow-worker.js
var powWorker []byte

// powWorkerHandler handles GET /queue-worker.js: the web worker in which the
// waiting room's page solves a proof-of-work puzzle.
func (s *Server) powWorkerHandler(c *gin.Context) {
	c.Header("Cache-Control", "public, max-age=3600")
	c.Data(http.StatusOK, "text/javascript; charset=utf-8", powWorker)
}

// queuePageHandler handles GET /queue/:program?buyer=…: the waiting
// room's page. It joins the line, shows the place and a progress bar,
// checks again when Retry-After says, and sends the buyer on to the
// program's checkout URL with the admission token once admitted, or says
// sold out.
func (s *Server) queuePageHandler(c *gin.Context) {
	program, ok := programParam(c)
	if !ok {
		return
	}
	checkout, err := s.rooms.Page(c.Request.Context(), program)
	if err != nil {
		s.roomError(c, err)
		return
	}
	// The URL goes into a script as a JSON string: json.Marshal escapes
	// <, > and & too, so it cannot end the script.
	quoted, _ := json.Marshal(checkout)
	page := strings.Replace(queuePage, `"{{CHECKOUT}}"`, string(quoted), 1)
	c.Header("Cache-Control", "no-store")
	c.Header("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; worker-src 'self'; style-src 'unsafe-inline'; connect-src 'self'")
	c.Data(http.StatusOK, "text/html; charset=utf-8", []byte(page))
}
