package relay

import "testing"

// The replicas of a slot's master are counted from CLUSTER NODES whatever
// their link (a replica cut off is the one a failover may promote); a
// failed master serves nothing.
func TestReplicasOf(t *testing.T) {
	nodes := `9e92 127.0.0.1:35069@45069 master,fail - 1 1 1 disconnected
7484 127.0.0.1:37465@47465 master - 0 1 4 connected 0-5460
8b56 127.0.0.1:36889@46889 slave 7484 0 1 0 disconnected
800a 127.0.0.1:42543@52543 slave,fail? 7484 0 1 2 connected
2a7e 127.0.0.1:36905@46905 myself,master - 0 1 2 connected 5461-10922 10923
a6fd 127.0.0.1:33323@43323 master - 0 1 0 connected 10924-16383
`
	for _, c := range []struct {
		slot int64
		want int
	}{{0, 2}, {5460, 2}, {5461, 0}, {10923, 0}, {16383, 0}} {
		if got, err := replicasOf(nodes, c.slot); err != nil || got != c.want {
			t.Errorf("replicasOf(slot %d) = %d, %v, want %d", c.slot, got, err, c.want)
		}
	}
	if _, err := replicasOf(nodes, 20000); err == nil {
		t.Error("a slot no master serves: want an error")
	}
}
