package ipamd

import (
	"testing"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/warmpool"
)

// TestAdaptiveDefault: with no warm variable set, a new node keeps one
// address warm; eight pods arriving together all get addresses from one
// ENI, with growth calls sized to them rather than one per pod; once they
// are gone and the burst is out of the pool's memory, the node is back to
// one warm address on its primary ENI.
func TestAdaptiveDefault(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_ENI_TARGET": "", "IP_COOLDOWN_PERIOD": "30"})
	n.start()
	if st := n.status(); st.Warm != 1 || st.ENIs != 1 {
		t.Fatalf("new node: %+v; want 1 warm address on the primary ENI", st)
	}
	pods := names("a", 8)
	type added struct {
		a   api.Assignment
		err error
	}
	done := make(chan added, len(pods))
	for _, id := range pods {
		go func() {
			a, err := n.add(id)
			done <- added{a, err}
		}()
	}
	enis := map[string]int{}
	for range pods {
		r := <-done
		if r.err != nil {
			t.Fatalf("ADD: %v", r.err)
		}
		enis[r.a.ENIID]++
	}
	f := c.Cloud.Faults()
	// The burst's margin may make the pool attach a second ENI once the
	// pods are served (how soon depends on the machine's load); the pods
	// themselves fit on the primary ENI's nine secondary addresses.
	if st := n.status(); st.Assigned != 8 || len(enis) != 1 {
		t.Errorf("after 8 pods: %+v, pods per ENI %v; want 8 assigned on one ENI", st, enis)
	}
	if got := f.Calls("AssignPrivateIpAddresses"); got > 4 {
		t.Errorf("%d assign calls for 8 pods; want growth sized to the demand", got)
	}
	for _, id := range pods {
		n.del(id)
	}
	quiet := warmpool.BurstMemory + warmpool.ChunkMemory + warmpool.ReleaseDelay
	for end := n.clock.Now().Add(quiet); n.clock.Now().Before(end); {
		n.trim(1)
	}
	n.trim(2)
	if st := n.status(); st.Assigned != 0 || st.Warm+st.Cooling > 1 || st.ENIs != 1 {
		t.Errorf("after the pods left: %+v; want at most 1 address held", st)
	}
}
