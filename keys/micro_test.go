package keys

import "testing"

func BenchmarkMicroShardKeys(b *testing.B) {
	for i := 0; b.Loop(); i++ {
		k := Shard(MustID("show-1"), MustID("ga"), i%12, 12)
		_ = k.Stock()
		_ = k.Deduction(MustID("0b5c3a6e-2f7d-4c1e-9d3b-8a7e6f5d4c3b"))
	}
}

func BenchmarkMicroCheckID(b *testing.B) {
	for b.Loop() {
		_ = CheckID("0b5c3a6e-2f7d-4c1e-9d3b-8a7e6f5d4c3b")
	}
}
