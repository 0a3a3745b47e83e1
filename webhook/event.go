package webhook

import "time"

// Event is an event as a delivery's body carries it (and as GET
// /v1/admin/events lists it): a receiver decodes the body into it after
// Verify. A pool's stock is named by its ticket and pool.
type Event struct {
	Seq      int64     `json:"seq"`
	ID       string    `json:"id"` // stable: de-duplicate by it (the webhook-id header too)
	Type     string    `json:"type"`
	Program  string    `json:"program"`
	Ticket   string    `json:"ticket"`
	Pool     string    `json:"pool,omitempty"`
	Subject  string    `json:"subject,omitempty"` // the order's or hold's id
	OrderID  string    `json:"order_id,omitempty"`
	Buyer    string    `json:"buyer,omitempty"`
	CartID   string    `json:"cart_id,omitempty"`
	Quantity int64     `json:"quantity,omitempty"`
	ToPool   string    `json:"to_pool,omitempty"` // pool.moved: where ("public" for the public pool)
	At       time.Time `json:"at"`
}
