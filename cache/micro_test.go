package cache_test

import (
	"context"
	"testing"
	"time"

	"github.com/stockgate/stockgate/cache"
	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/stock"
)

func BenchmarkMicroSoldOutHit(b *testing.B) {
	c, err := cache.New(cache.Options{SoldOutTTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	sku := stock.SKU{Program: keys.MustID("show-1"), Ticket: keys.MustID("ga")}
	c.MarkSoldOut(sku, c.Since())
	for b.Loop() {
		if !c.SoldOut(sku) {
			b.Fatal("miss")
		}
	}
}

func BenchmarkMicroSettingsHit(b *testing.B) {
	l, err := cache.NewLoading(time.Hour, 100, nil, func(context.Context, stock.SKU) (int64, error) { return 1, nil })
	if err != nil {
		b.Fatal(err)
	}
	sku := stock.SKU{Program: keys.MustID("show-1"), Ticket: keys.MustID("ga")}
	ctx := context.Background()
	for b.Loop() {
		if _, err := l.Get(ctx, sku); err != nil {
			b.Fatal(err)
		}
	}
}

// The settings caches' hit, as sale builds them: fresh for the TTL, then
// refreshed behind the reads (NewRefreshing).
func BenchmarkMicroSettingsHitRefreshing(b *testing.B) {
	l, err := cache.NewRefreshing(time.Hour, 2*time.Hour, 100, nil, func(context.Context, stock.SKU) (int64, error) { return 1, nil })
	if err != nil {
		b.Fatal(err)
	}
	sku := stock.SKU{Program: keys.MustID("show-1"), Ticket: keys.MustID("ga")}
	ctx := context.Background()
	for b.Loop() {
		if _, err := l.Get(ctx, sku); err != nil {
			b.Fatal(err)
		}
	}
}
