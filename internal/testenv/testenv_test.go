package testenv

import (
	"context"
	"strings"
	"testing"
)

func TestMasterRangesMatchRedisCli(t *testing.T) {
	// redis-cli --cluster create splits 3 masters as 0-5460, 5461-10922, 10923-16383.
	got := MasterRanges(3)
	want := []int{0, 5461, 10923, 16384}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("MasterRanges(3) = %v, want %v", got, want)
		}
	}
}

// TestClusterWithReplicas starts 3 masters + 3 replicas and checks the
// shape the failover tests rely on: every master has one replica.
func TestClusterWithReplicas(t *testing.T) {
	c := NewCluster(t, ClusterOptions{ReplicasPerMaster: 1})
	cl := c.Nodes[0].Client()
	defer cl.Close()
	nodes, err := cl.ClusterNodes(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	masters, replicas := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		switch {
		case strings.Contains(f[2], "master"):
			masters++
		case strings.Contains(f[2], "slave"):
			replicas++
			if f[3] == "-" {
				t.Errorf("replica without a master: %s", line)
			}
		}
	}
	if masters != 3 || replicas != 3 {
		t.Errorf("cluster has %d masters and %d replicas, want 3 and 3:\n%s", masters, replicas, nodes)
	}
	rc := c.Client()
	defer rc.Close()
	if err := rc.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Errorf("SET through the cluster client: %v", err)
	}
}
