package cluster

import (
	"context"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
)

// checkLeaks finds assignments whose pod is gone and releases them, safely
// (field failure K02):
//   - only on a synced cache with no API error outstanding (the caller checks;
//     an error clears every timer, so the grace restarts after recovery);
//   - the pod (namespace/name; a different UID under the same name counts as
//     gone: a recreated StatefulSet pod has its own sandbox) must have been
//     missing from the cache for LeakGrace without a break;
//   - a live list from the API server must confirm it (an error: no release);
//   - the daemon's host checks must find no veth and no route (ReleaseLeaked);
//     a refusal restarts the grace, so a lasting one costs one live list per
//     grace, not one per tick.
//
// Assignments without a pod name (runtimes that pass no K8S_POD_NAME) are
// never judged here; CNI GC and the host checks cover them. The gauge
// vpcip_addresses_without_pod counts assignments whose pod the cache lacks.
func (c *Cluster) checkLeaks(ctx context.Context, snap Snapshot) {
	now := c.o.Now()
	var due []Assignment
	missing := 0
	c.mu.Lock()
	seen := make(map[api.Key]bool, len(snap.Assignments))
	for _, a := range snap.Assignments {
		if a.Pod.Name == "" {
			continue
		}
		seen[a.Key] = true
		if p := c.cachedPod(a.Pod.Namespace, a.Pod.Name); p != nil && (a.Pod.UID == "" || string(p.UID) == a.Pod.UID) {
			delete(c.goneAt, a.Key)
			continue
		}
		missing++
		since, ok := c.goneAt[a.Key]
		if !ok {
			c.goneAt[a.Key] = now
			continue
		}
		if now.Sub(since) >= c.o.LeakGrace {
			due = append(due, a)
		}
	}
	for k := range c.goneAt {
		if !seen[k] {
			delete(c.goneAt, k)
		}
	}
	c.mu.Unlock()
	c.metrics.withoutPod.Set(missing)
	if len(due) == 0 {
		return
	}
	live, err := c.livePods(ctx)
	if err != nil {
		c.apiError("list pods before releasing", err)
		return
	}
	for _, a := range due {
		if uid, ok := live[podName{a.Pod.Namespace, a.Pod.Name}]; ok && (a.Pod.UID == "" || uid == a.Pod.UID) {
			c.metrics.leakMismatch.Inc()
			c.log.Warn("pod missing from the cache but listed by the API server: not released", "pod", a.Pod.Namespace+"/"+a.Pod.Name, "key", a.Key.String())
			c.forget(a.Key)
			continue
		}
		released, why := c.o.Daemon.ReleaseLeaked(a)
		if !released {
			// Asked again after another grace, not at every tick: a refusal
			// that lasts (a static pod's mirror UID, a force-deleted pod
			// whose sandbox lingers) would otherwise cost a live LIST of the
			// node's pods and a log line every second, forever.
			c.mu.Lock()
			if _, ok := c.goneAt[a.Key]; ok {
				c.goneAt[a.Key] = now
			}
			c.mu.Unlock()
			c.log.Info("assignment of a gone pod kept: host still shows it, or its rules could not be removed; asked again after the grace",
				"pod", a.Pod.Namespace+"/"+a.Pod.Name, "key", a.Key.String(), "why", why, "grace", c.o.LeakGrace.String())
			continue
		}
		c.forget(a.Key)
		c.metrics.leaksReleased.Inc()
		c.log.Warn("released the address of a pod gone without a DEL", "pod", a.Pod.Namespace+"/"+a.Pod.Name, "key", a.Key.String(),
			"goneFor", c.o.LeakGrace.String()+"+")
	}
}

func (c *Cluster) forget(k api.Key) {
	c.mu.Lock()
	delete(c.goneAt, k)
	c.mu.Unlock()
}

// resetLeakTimers drops every "gone since" timer: after an API error the
// cache's absences are not evidence.
func (c *Cluster) resetLeakTimers() {
	c.mu.Lock()
	c.goneAt = map[api.Key]time.Time{}
	c.mu.Unlock()
}
