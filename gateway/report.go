package gateway

import (
	"encoding/csv"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/stockgate/stockgate/sale"
)

// reportLine is one SKU's (or pool's) line of a reconciliation report.
type reportLine struct {
	Ticket         string `json:"ticket"`
	Pool           string `json:"pool,omitempty"`
	Total          int64  `json:"total"`
	Sold           int64  `json:"sold"`
	Held           int64  `json:"held"`
	Open           int64  `json:"open"`
	Orders         int64  `json:"orders"`
	OrderUnits     int64  `json:"order_units"`
	PurchasedUnits int64  `json:"purchased_units"`
	ConfirmedUnits int64  `json:"confirmed_units"`
	CartUnits      int64  `json:"cart_units"`
	Refunds        int64  `json:"refunds"`
	RefundedUnits  int64  `json:"refunded_units"`
	HeldUnits      int64  `json:"held_units"`
	ExpiredUnits   int64  `json:"expired_units"`
	CancelledUnits int64  `json:"cancelled_units"`
	Listed         int64  `json:"listed_units"`
	Resold         int64  `json:"resold_units"`
	Transferred    int64  `json:"transferred_units"`
	CompUnits      int64  `json:"comp_units"`
	BoxOfficeUnits int64  `json:"box_office_units"`
	Seated         bool   `json:"seated"`
	Balanced       bool   `json:"balanced"`
	GateRemaining  *int64 `json:"gate_remaining"`
	GateDifference int64  `json:"gate_difference"`
}

func reportLineOf(r sale.StockReport) reportLine {
	l := reportLine{Ticket: r.SKU.Base().Ticket.String(), Total: r.Total, Sold: r.Sold, Held: r.Held, Open: r.Open,
		Orders: r.Orders, OrderUnits: r.OrderUnits, PurchasedUnits: r.PurchasedUnits, ConfirmedUnits: r.ConfirmedUnits,
		CartUnits: r.CartUnits, Refunds: r.Refunds, RefundedUnits: r.RefundedUnits, HeldUnits: r.HeldUnits,
		ExpiredUnits: r.ExpiredUnits, CancelledUnits: r.CancelledUnits, Listed: r.Listed, Resold: r.Resold,
		Transferred: r.Transferred, CompUnits: r.CompUnits, BoxOfficeUnits: r.BoxOfficeUnits, Seated: r.Seated, Balanced: r.Balanced(),
		GateDifference: r.GateDifference()}
	if p := r.SKU.Pool(); !p.IsZero() {
		l.Pool = p.String()
	}
	if r.GateRead {
		l.GateRemaining = &r.GateRemaining
	}
	return l
}

// reportColumns are the CSV's columns, in the JSON's names and order.
var reportColumns = []string{"ticket", "pool", "total", "sold", "held", "open", "orders", "order_units", "purchased_units",
	"confirmed_units", "cart_units", "refunds", "refunded_units", "held_units", "expired_units", "cancelled_units",
	"listed_units", "resold_units", "transferred_units", "comp_units", "box_office_units", "seated",
	"balanced", "gate_remaining", "gate_difference"}

func (l reportLine) csv() []string {
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	gate := ""
	if l.GateRemaining != nil {
		gate = n(*l.GateRemaining)
	}
	return []string{l.Ticket, l.Pool, n(l.Total), n(l.Sold), n(l.Held), n(l.Open), n(l.Orders), n(l.OrderUnits),
		n(l.PurchasedUnits), n(l.ConfirmedUnits), n(l.CartUnits), n(l.Refunds), n(l.RefundedUnits), n(l.HeldUnits),
		n(l.ExpiredUnits), n(l.CancelledUnits), n(l.Listed), n(l.Resold), n(l.Transferred), n(l.CompUnits),
		n(l.BoxOfficeUnits), strconv.FormatBool(l.Seated), strconv.FormatBool(l.Balanced), gate,
		n(l.GateDifference)}
}

// getReport handles GET /v1/admin/programs/:program/report: the program's
// reconciliation report, as JSON, or as CSV with ?format=csv (or Accept:
// text/csv). It reads; it moves nothing.
func (s *Server) getReport(c *gin.Context) {
	program, ok := programParam(c)
	if !ok {
		return
	}
	format, given := c.GetQuery("format")
	switch {
	case len(c.QueryArray("format")) > 1 || given && format == "":
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "format is json or csv, once", 0)
		return
	case format == "" && c.NegotiateFormat(gin.MIMEJSON, "text/csv") == "text/csv":
		format = "csv"
	case format == "":
		format = "json"
	case format != "json" && format != "csv":
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field", "format is json or csv", 0)
		return
	}
	rs, err := s.sale.Report(c.Request.Context(), program)
	if err != nil {
		s.writeError(c, err)
		return
	}
	lines := make([]reportLine, 0, len(rs))
	balanced := true
	for _, r := range rs {
		l := reportLineOf(r)
		balanced = balanced && l.Balanced
		lines = append(lines, l)
	}
	if format == "json" {
		c.JSON(http.StatusOK, gin.H{"program": program.String(), "balanced": balanced, "skus": lines})
		return
	}
	c.Header("Content-Type", "text/csv; charset=utf-8")
	c.Header("Content-Disposition", `attachment; filename="`+program.String()+`-report.csv"`)
	c.Status(http.StatusOK)
	w := csv.NewWriter(c.Writer)
	_ = w.Write(reportColumns)
	for _, l := range lines {
		_ = w.Write(l.csv())
	}
	w.Flush()
}
