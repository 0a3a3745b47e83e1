package sale

import "testing"

// The sizing rule, without servers: a shard per perShard takes a second,
// never more shards than the units fill at four of the largest orders a
// shard, half when the takes probe more than two shards each, within
// 1..most.
func TestShardsFor(t *testing.T) {
	for _, c := range []struct {
		name         string
		rate, probes float64
		left, maxPer int64
		have, most   int
		want         int
	}{
		{"idle", 0, 0, 10_000, 4, 1, 16, 1},
		{"one shard's rate", 2000, 1, 10_000, 4, 1, 16, 1},
		{"past one shard's rate", 2001, 1, 10_000, 4, 1, 16, 2},
		{"a shard per 2,000 takes a second", 9_000, 1, 10_000, 4, 1, 16, 5},
		{"at most most", 1e6, 1, 1e6, 4, 1, 16, 16},
		{"no more than the units fill", 9_000, 1, 48, 4, 1, 16, 3},
		{"the last units on one shard", 9_000, 1, 15, 4, 8, 16, 1},
		{"sold out", 9_000, 1, 0, 4, 8, 16, 1},
		{"probing shards run empty: half", 20_000, 3, 1e6, 4, 8, 16, 4},
		{"probing with one shard: nothing to fold", 20_000, 3, 1e6, 4, 1, 16, 10},
		{"quantity 1 fills finer shards", 9_000, 1, 20, 1, 1, 16, 5},
	} {
		if got := shardsFor(c.rate, c.probes, c.left, c.maxPer, c.have, c.most, 2000); got != c.want {
			t.Errorf("%s: shardsFor(%v, %v, %d, %d, %d, %d) = %d, want %d", c.name, c.rate, c.probes, c.left, c.maxPer, c.have, c.most, got, c.want)
		}
	}
}

func TestThin(t *testing.T) {
	if !thin(15, 4, 2) || thin(32, 4, 2) || thin(1, 4, 1) {
		t.Error("thin: want 15 units over 2 shards of max 4 thin, 32 not, one shard never")
	}
}
