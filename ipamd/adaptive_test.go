package ipamd

import (
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/warmpool"
)

// TestAdaptiveDefault: with no warm variable set, a new node fills its
// primary ENI in one call, as the reference does (in secondary-IP mode an
// ENI's worth of addresses costs one call whole or in part); eight pods
// arriving together all get addresses without another assign call; once
// they are gone and the burst is out of the pool's memory, the node is back
// to its primary ENI holding less than a release band (half its slots).
func TestAdaptiveDefault(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_ENI_TARGET": "", "IP_COOLDOWN_PERIOD": "30"})
	n.start()
	st0 := n.status()
	if st0.Warm != st0.Capacity || st0.ENIs != 1 {
		t.Fatalf("new node: %+v; want the primary ENI's addresses warm", st0)
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
	// ENIs may be attached for room for the next such burst, as many as
	// the arrival rate measured on the real clock asks for (a loaded
	// machine spreads the ADDs: 3 ENIs were seen under CI's load), so they
	// are not counted here (warmpool's tests size them on a virtual
	// clock); the pods themselves share the primary ENI's nine secondary
	// addresses, from one assign call.
	if st := n.status(); st.Assigned != 8 || len(enis) != 1 {
		t.Errorf("after 8 pods: %+v, pods per ENI %v; want 8 assigned on one ENI", st, enis)
	}
	if got := f.Calls("AssignPrivateIpAddresses"); got != 1 {
		t.Errorf("%d assign calls for a new node and 8 pods; want 1", got)
	}
	for _, id := range pods {
		n.del(id)
	}
	// Once the burst is out of memory, ENIs attached for its room go too.
	quiet := max(warmpool.BurstMemory+warmpool.ChunkMemory+warmpool.ReleaseDelay, warmpool.ENIDeleteDelay)
	for end := n.clock.Now().Add(quiet); n.clock.Now().Before(end); {
		n.trim(1)
	}
	n.trim(2)
	band := max(warmpool.MinBand, (st0.Capacity+1)/2) // less is not worth a release call
	if st := n.status(); st.Assigned != 0 || st.Warm+st.Cooling >= band || st.ENIs != 1 {
		t.Errorf("after the pods left: %+v; want fewer than %d addresses held on the primary ENI", st, band)
	}
}

// A restarted daemon keeps the addresses the previous run grew for
// ReleaseDelay, as after its own growth: it remembers no demand to judge
// them by, and releasing them at once costs a call now and another when
// the next pods come.
func TestAdaptiveRestartKeepsThePool(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, map[string]string{"WARM_ENI_TARGET": "", "IP_COOLDOWN_PERIOD": "30"})
	n.start()
	st0 := n.status()
	n.restart()
	n.clock.Advance(warmpool.ReleaseDelay - time.Second)
	n.cycle()
	if st := n.status(); st.Warm != st0.Warm {
		t.Errorf("%s after a restart: %d warm, want the %d held before it", warmpool.ReleaseDelay-time.Second, st.Warm, st0.Warm)
	}
	if got := c.Cloud.Faults().Calls("UnassignPrivateIpAddresses"); got != 0 {
		t.Errorf("%d release calls after a restart of an idle node within ReleaseDelay; want 0", got)
	}
}
