package gateway

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/sale"
	"github.com/stockgate/stockgate/stock"
)

type seatBody struct {
	ID      string `json:"id"`
	Section string `json:"section"`
	Row     string `json:"row"`
	Number  int    `json:"number"`
}

type seatMapBody struct {
	Seats []seatBody `json:"seats"`
}

// putSeats handles PUT /v1/admin/skus/:program/:ticket/seats: add seats to
// the SKU's map (seats it has keep their state).
func (s *Server) putSeats(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	var body seatMapBody
	if !s.decodeBodyMax(c, &body, 1<<20) {
		return
	}
	list := make([]sale.Seat, len(body.Seats))
	for i, st := range body.Seats {
		id, err := keys.ParseID(st.ID)
		section, serr := keys.ParseID(st.Section)
		if err != nil || serr != nil {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field",
				fmt.Sprintf("seat %q is invalid or repeated (ids and sections match [A-Za-z0-9_-]{1,64})", st.ID), 0)
			return
		}
		list[i] = sale.Seat{ID: id, Section: section, Row: st.Row, Number: st.Number}
	}
	n, err := s.sale.LoadSeats(c.Request.Context(), sku, list)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"program": sku.Program.String(), "ticket": sku.Ticket.String(), "seats": n})
}

type seatHoldBody struct {
	Buyer string   `json:"buyer"`
	Seats []string `json:"seats"`
	// Or best-available: Quantity adjacent seats in Section.
	Quantity   *int64 `json:"quantity"`
	Section    string `json:"section"`
	TTLSeconds *int64 `json:"ttl_seconds"`
}

// postSeatHold handles POST /v1/skus/:program/:ticket/seat-holds: hold the
// given seats, all of one section, all or nothing (409 names the seats
// already taken), or the best adjacent seats.
func (s *Server) postSeatHold(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	ask, ok := s.ask(c)
	if !ok {
		return
	}
	var body seatHoldBody
	if !s.decodeBody(c, &body) {
		return
	}
	if ask.Buyer, ok = buyerField(c, body.Buyer); !ok {
		return
	}
	t := sale.SeatTake{Ask: ask, SKU: sku}
	const bestUsage = "give seats (a list of seat ids), or quantity (1..64) and optionally a section, for the best adjacent seats"
	if body.Section != "" {
		var err error
		if t.Section, err = keys.ParseID(body.Section); err != nil {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", bestUsage, 0)
			return
		}
	}
	for _, text := range body.Seats {
		id, err := keys.ParseID(text)
		if err != nil {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", fmt.Sprintf("seat %q is invalid or repeated", text), 0)
			return
		}
		t.Seats = append(t.Seats, id)
	}
	if body.Quantity != nil {
		if *body.Quantity < 1 || *body.Quantity > sale.MaxBestSeats {
			writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", bestUsage, 0)
			return
		}
		t.Quantity = int(*body.Quantity)
	}
	if t.TTL, ok = holdTTL(c, body.TTLSeconds); !ok {
		return
	}
	s.written(c, http.StatusCreated)(s.sale.HoldSeats(c.Request.Context(), t))
}

type seatView struct {
	ID      string `json:"id"`
	Section string `json:"section"`
	Row     string `json:"row"`
	Number  int    `json:"number"`
	State   string `json:"state"`
}

type sectionView struct {
	Program string     `json:"program"`
	Ticket  string     `json:"ticket"`
	Section string     `json:"section"`
	Free    int        `json:"free"`
	Seats   []seatView `json:"seats"`
}

// getSeats handles GET /v1/skus/:program/:ticket/seats?section=A&ids=…:
// the section's seats (or all, or the ones named) and their state.
func (s *Server) getSeats(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	var want []keys.ID
	if list := c.Query("ids"); list != "" {
		texts := strings.Split(list, ",")
		if len(texts) > stock.MaxPerOrderCap {
			writeProblem(c, http.StatusBadRequest, "invalid-id", "at most 1000 seat ids", 0)
			return
		}
		for _, text := range texts {
			id, err := keys.ParseID(text)
			if err != nil {
				writeProblem(c, http.StatusBadRequest, "invalid-id", fmt.Sprintf("seat id %q: ids match [A-Za-z0-9_-]{1,64}", text), 0)
				return
			}
			want = append(want, id)
		}
	}
	var section keys.ID
	if text := c.Query("section"); text != "" {
		var err error
		if section, err = keys.ParseID(text); err != nil {
			writeProblem(c, http.StatusBadRequest, "invalid-id", "section ids match [A-Za-z0-9_-]{1,64}", 0)
			return
		}
	}
	sec, err := s.sale.Seats(c.Request.Context(), sku, section)
	if err != nil {
		s.writeError(c, err)
		return
	}
	v := sectionView{Program: sku.Program.String(), Ticket: sku.Ticket.String(), Section: sec.Section.String(), Seats: []seatView{}}
	for _, st := range sec.Seats {
		if want != nil && !slices.Contains(want, st.ID) {
			continue
		}
		v.Seats = append(v.Seats, seatView{ID: st.ID.String(), Section: st.Section.String(), Row: st.Row, Number: st.Number, State: st.State})
		if st.State == "free" {
			v.Free++
		}
	}
	c.Header("Cache-Control", "max-age=1")
	c.JSON(http.StatusOK, v)
}

// seatCheckView is the body of a seat consistency check.
type seatCheckView struct {
	Checked  int      `json:"checked"`
	Differed []string `json:"differed"`
	Repaired int      `json:"repaired"`
}

// checkSeats handles POST /v1/admin/skus/:program/:ticket/seats/check:
// compare the gate's seats with the ledger's and repair now.
func (s *Server) checkSeats(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	r, err := s.sale.CheckSeats(c.Request.Context(), sku)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, seatCheckView(r))
}

// stockView is the public answer to "how many are left?".
type stockView struct {
	Program   string `json:"program"`
	Ticket    string `json:"ticket"`
	Remaining int64  `json:"remaining"`
	SoldOut   bool   `json:"sold_out"`
}

// getStock handles GET /v1/skus/:program/:ticket/stock, answered from the
// local cache; a miss loads it once for all concurrent readers.
func (s *Server) getStock(c *gin.Context) {
	sku, ok := skuParam(c)
	if !ok {
		return
	}
	pool, ok := poolQuery(c)
	if !ok {
		return
	}
	v, err := s.sale.Stock(c.Request.Context(), sale.PoolSKU(sku, pool))
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.Header("Cache-Control", "max-age=1")
	c.JSON(http.StatusOK, stockView{Program: sku.Program.String(), Ticket: sku.Ticket.String(), Remaining: v.Remaining, SoldOut: v.SoldOut})
}
