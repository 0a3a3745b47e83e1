package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/stockgate/stockgate/client"
)

// smokeSKU is the ticket the smoke test sells: a program of its own, so
// the report of no real sale counts it. Each run buys one and refunds it,
// so its stock stays whole run after run.
var smokeSKU = client.SKU{Program: "stockgate-smoke", Ticket: "smoke"}

// smoke buys a ticket through the gateway at url and refunds it, as a
// platform would (the admin routes at adminURL set the ticket up): what
// the chart's `helm test` runs against the release's Service. Each step
// must answer what the API promises; the first that doesn't is the error.
func smoke(ctx context.Context, url, adminURL, token string, log *slog.Logger) error {
	if url == "" {
		return errors.New("STOCKGATE_SMOKE_URL (-smoke-url) is required: the gateway to buy from")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	buyers, err := client.New(client.Options{BaseURL: url})
	if err != nil {
		return err
	}
	admin, err := client.New(client.Options{BaseURL: adminURL, AdminToken: token})
	if err != nil {
		return err
	}
	total, shards, most := int64(1000), 1, int64(1)
	if _, err := admin.PutSKU(ctx, smokeSKU, client.SKUConfig{Total: &total, Shards: &shards, MaxPerOrder: &most}); err != nil {
		return fmt.Errorf("set up the smoke ticket (admin routes at %s): %w", adminURL, err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	run := hex.EncodeToString(b)
	buyer := "smoke-" + run
	began := time.Now()
	o, err := buyers.Purchase(ctx, smokeSKU, client.Key("smoke-buy-"+run), buyer, 1)
	if err != nil {
		return fmt.Errorf("buy a ticket: %w", err)
	}
	if o.OrderID == "" || o.Quantity != 1 {
		return fmt.Errorf("buy a ticket: answered %+v, want an order of 1", o)
	}
	got, err := buyers.GetOrder(ctx, o.OrderID)
	if err != nil || got.State != "standing" {
		return fmt.Errorf("read the order %s back: %+v, %v", o.OrderID, got, err)
	}
	r, err := buyers.Refund(ctx, o.OrderID, client.Key("smoke-refund-"+run), buyer)
	if err != nil || r.RefundedAt == nil {
		return fmt.Errorf("refund the order %s: %+v, %v", o.OrderID, r, err)
	}
	log.Info("smoke test passed: a ticket bought and refunded", "url", url, "order", o.OrderID, "took", time.Since(began).String())
	return nil
}
