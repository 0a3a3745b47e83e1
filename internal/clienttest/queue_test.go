package clienttest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stockgate/stockgate/client"
	"github.com/stockgate/stockgate/internal/testenv"
)

// The waiting room through the client: the admin calls, a join, checks
// until admitted, a purchase with the admission (Admitted), and the
// refusals as errors.
func TestQueueCalls(t *testing.T) {
	ctx := context.Background()
	base := startGateway(t)
	c := newClient(t, base, client.Options{AdminToken: token})
	sku := client.SKU{Program: testenv.ID(t, "q"), Ticket: "ga"}
	if _, err := c.PutSKU(ctx, sku, client.SKUConfig{Total: ptr[int64](3), Shards: ptr(1), MaxPerOrder: ptr[int64](2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetQueue(ctx, sku.Program); !errors.Is(err, client.ErrNoQueue) {
		t.Fatalf("GetQueue before = %v, want ErrNoQueue", err)
	}
	q, err := c.PutQueue(ctx, sku.Program, client.QueueConfig{OpensInSeconds: ptr[int64](0), RatePerSecond: 20, WindowSeconds: 60, PerRemaining: 1})
	if err != nil || q.RatePerSecond != 20 {
		t.Fatalf("PutQueue = %+v, %v", q, err)
	}
	if _, err := c.Purchase(ctx, sku, "k0", "ann", 1); !errors.Is(err, client.ErrAdmissionRequired) {
		t.Fatalf("Purchase without admission = %v", err)
	}
	st, err := c.JoinQueue(ctx, sku.Program, "ann")
	if err != nil || st.Ticket == "" {
		t.Fatalf("JoinQueue = %+v, %v", st, err)
	}
	if _, err := c.CheckQueue(ctx, sku.Program, st.Ticket+"x"); !errors.Is(err, client.ErrQueueTicket) {
		t.Fatalf("CheckQueue of a forged ticket = %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); st.State != "admitted"; time.Sleep(50 * time.Millisecond) { // poll interval
		if time.Now().After(deadline) {
			t.Fatalf("not admitted after 10s: %+v", st)
		}
		if st, err = c.CheckQueue(ctx, sku.Program, st.Ticket); err != nil {
			t.Fatal(err)
		}
	}
	in := c.Admitted(st.AdmissionToken)
	if o, err := in.Purchase(ctx, sku, "k1", "ann", 1); err != nil || o.Quantity != 1 {
		t.Fatalf("Purchase with admission = %+v, %v", o, err)
	}
	if _, err := in.Purchase(ctx, sku, "k2", "ann", 1); !errors.Is(err, client.ErrAdmissionUsed) {
		t.Fatalf("second order on one admission = %v", err)
	}
	if err := c.DeleteQueue(ctx, sku.Program); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetQueue(ctx, sku.Program); !errors.Is(err, client.ErrNoQueue) {
		t.Fatalf("GetQueue after = %v, want ErrNoQueue", err)
	}
}
