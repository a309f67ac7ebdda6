package vpcsim

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// SetIMDSOverride makes the instance's IMDS answer value for path (relative
// to /latest/, e.g. "meta-data/network/interfaces/macs/<mac>/local-ipv4s"),
// whatever the model says: a wrong or stale metadata view for tests.
func (f *Faults) SetIMDSOverride(instanceID, path, value string) {
	f.editIMDS(instanceID, path, &value)
}

// HideIMDS makes the instance's IMDS answer 404 for path and everything
// under it, and leave it out of directory listings (e.g. hide one MAC).
func (f *Faults) HideIMDS(instanceID, path string) {
	f.editIMDS(instanceID, path, nil)
}

// ClearIMDSOverrides removes the instance's overrides and hidden paths.
func (f *Faults) ClearIMDSOverrides(instanceID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.imdsEdits, instanceID)
}

func (f *Faults) editIMDS(instanceID, path string, value *string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.imdsEdits[instanceID] == nil {
		f.imdsEdits[instanceID] = map[string]*string{}
	}
	f.imdsEdits[instanceID][strings.Trim(path, "/")] = value
}

// applyIMDSEdits changes an instance's metadata tree as the overrides say.
func (f *Faults) applyIMDSEdits(instanceID string, tree map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for path, v := range f.imdsEdits[instanceID] {
		if v != nil {
			tree[path] = *v
			continue
		}
		for k := range tree {
			if k == path || strings.HasPrefix(k, path+"/") {
				delete(tree, k)
			}
		}
	}
}

// SetDescribeLag makes DescribeNetworkInterfaces eventually consistent, as
// EC2's is: it answers with the ENIs as they were d ago, so a new ENI is
// briefly InvalidNetworkInterfaceID.NotFound and a change shows late. It
// applies to changes made after it is set. 0 turns it off. It takes the
// cloud's lock, so an Observer must not call it.
func (f *Faults) SetDescribeLag(d time.Duration) {
	f.mu.Lock()
	f.describeLag = max(d, 0)
	hook := f.onDescribeLag
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
}

func (f *Faults) describeLagNow() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.describeLag
}

// eniSnapshot is every ENI at one moment, for lagging describes.
type eniSnapshot struct {
	at   time.Time
	enis map[string]*eni
}

// describeHistoryLen bounds the remembered ENI snapshots.
const describeHistoryLen = 256

// restartENIHistory drops the ENI snapshots and, when describes lag, takes
// the first: the state every lagging describe starts from.
func (c *Cloud) restartENIHistory() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.eniHistory = nil
	c.recordENIsLocked()
}

// recordENIsLocked remembers every ENI as it is now, when describes lag.
func (c *Cloud) recordENIsLocked() {
	if c.faults.describeLagNow() == 0 {
		c.eniHistory = nil
		return
	}
	snap := eniSnapshot{at: time.Now(), enis: make(map[string]*eni, len(c.enis))}
	for id, e := range c.enis {
		cp := *e
		cp.secondaries = slices.Clone(e.secondaries)
		cp.prefixes = slices.Clone(e.prefixes)
		cp.ipv6 = slices.Clone(e.ipv6)
		cp.ipv6Prefixes = slices.Clone(e.ipv6Prefixes)
		cp.groups = slices.Clone(e.groups)
		cp.tags = maps.Clone(e.tags)
		snap.enis[id] = &cp
	}
	c.eniHistory = append(c.eniHistory, snap)
	if len(c.eniHistory) > describeHistoryLen {
		c.eniHistory = slices.Delete(c.eniHistory, 0, len(c.eniHistory)-describeHistoryLen)
	}
}

// visibleENIsLocked returns the ENIs DescribeNetworkInterfaces shows now:
// the live ones, or with a describe lag the newest snapshot at least that old.
func (c *Cloud) visibleENIsLocked() map[string]*eni {
	lag := c.faults.describeLagNow()
	if lag == 0 || len(c.eniHistory) == 0 {
		return c.enis
	}
	cut := time.Now().Add(-lag)
	visible := c.eniHistory[0].enis
	for _, s := range c.eniHistory {
		if s.at.After(cut) {
			break
		}
		visible = s.enis
	}
	return visible
}
