package shard_test

import (
	"testing"

	"github.com/stockgate/stockgate/keys"
	"github.com/stockgate/stockgate/shard"
)

func BenchmarkMicroStartShard(b *testing.B) {
	for b.Loop() {
		_ = shard.Start(keys.MustID("0b5c3a6e-2f7d-4c1e-9d3b-8a7e6f5d4c3b"), 12)
	}
}
