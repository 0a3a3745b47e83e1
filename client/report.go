package client

import (
	"context"
	"net/http"
	"net/url"
)

// ReportLine is one SKU's (or pool's) line of a program's reconciliation
// report: the ledger's SKU row beside its order and hold rows, and the
// gate's count.
type ReportLine struct {
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
	Seated         bool   `json:"seated"`
	// Balanced: the row agrees with its orders and holds and adds up to
	// its total.
	Balanced bool `json:"balanced"`
	// GateRemaining is Redis's count of what is left; nil when unread.
	GateRemaining  *int64 `json:"gate_remaining"`
	GateDifference int64  `json:"gate_difference"`
}

// Report is a program's reconciliation report.
type Report struct {
	Program  string       `json:"program"`
	Balanced bool         `json:"balanced"`
	SKUs     []ReportLine `json:"skus"`
}

// Report reads program's reconciliation report (admin). It moves nothing.
func (c *Client) Report(ctx context.Context, program string) (Report, error) {
	var r Report
	_, err := c.call(ctx, http.MethodGet, "/v1/admin/programs/"+url.PathEscape(program)+"/report", "", true, nil, &r)
	return r, err
}
