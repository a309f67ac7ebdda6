package cluster

import (
	"context"
	"slices"
	"strings"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/nodestatus"
)

// checkLeaks finds held attachments whose pod is gone and confirms them for
// PodsGone, safely (field failure K02):
//   - only on a synced cache with no API error outstanding (the caller checks;
//     an error clears every timer and every confirmation, so the grace
//     restarts after recovery);
//   - the pod (namespace/name; a different UID under the same name counts as
//     gone: a recreated StatefulSet pod has its own sandbox) must have been
//     missing from the cache for LeakGrace without a break;
//   - a live list from the API server must confirm it (an error: nothing
//     confirmed). One live list confirms every attachment due at that tick;
//     a confirmed one stays confirmed (no further list) until the daemon
//     stops holding it or the cache shows its pod again.
//
// The daemon then releases a confirmed attachment only when its host shows
// no trace of the pod (ipamd's goneReleaser); a confirmation is never a
// release by itself. Attachments without a pod name (runtimes that pass no
// K8S_POD_NAME) are never judged here; CNI GC and the host checks cover
// them. The gauge vpcip_addresses_without_pod counts held attachments whose
// pod the cache lacks.
func (c *Cluster) checkLeaks(ctx context.Context, snap nodestatus.Snapshot) {
	now := c.o.Now()
	var due []nodestatus.Held
	missing := 0
	c.mu.Lock()
	seen := make(map[api.Key]bool, len(snap.Held))
	for _, a := range snap.Held {
		if a.Pod.Name == "" {
			continue
		}
		seen[a.Key] = true
		if p := c.cachedPod(a.Pod.Namespace, a.Pod.Name); p != nil && (a.Pod.UID == "" || string(p.UID) == a.Pod.UID) {
			delete(c.leaks.goneAt, a.Key)
			delete(c.leaks.confirmed, a.Key)
			continue
		}
		missing++
		if c.leaks.confirmed[a.Key] {
			continue
		}
		since, ok := c.leaks.goneAt[a.Key]
		if !ok {
			c.leaks.goneAt[a.Key] = now
			continue
		}
		if now.Sub(since) >= c.o.LeakGrace {
			due = append(due, a)
		}
	}
	for k := range c.leaks.goneAt {
		if !seen[k] {
			delete(c.leaks.goneAt, k)
		}
	}
	for k := range c.leaks.confirmed {
		if !seen[k] {
			delete(c.leaks.confirmed, k)
		}
	}
	c.mu.Unlock()
	c.metrics.withoutPod.Set(missing)
	if len(due) == 0 {
		return
	}
	live, err := c.livePods(ctx)
	if err != nil {
		c.apiError("list pods before confirming leaks", err)
		return
	}
	newly := 0
	for _, a := range due {
		pod := a.Pod.Namespace + "/" + a.Pod.Name
		if uid, ok := live[podName{a.Pod.Namespace, a.Pod.Name}]; ok && (a.Pod.UID == "" || uid == a.Pod.UID) {
			c.metrics.leakMismatch.Inc()
			c.log.Warn("pod missing from the cache but listed by the API server: not released", "pod", pod, "key", a.Key.String())
			c.forget(a.Key)
			continue
		}
		c.mu.Lock()
		if _, ok := c.leaks.goneAt[a.Key]; ok { // not reset by an API error meanwhile
			c.leaks.confirmed[a.Key] = true
			newly++
		}
		c.mu.Unlock()
		c.log.Info("pod gone from the API server: its address is released once the host shows no trace of it",
			"pod", pod, "key", a.Key.String(), "goneFor", c.o.LeakGrace.String()+"+")
	}
	if newly > 0 {
		c.signal()
	}
}

// PodsGone returns the attachment keys, among those the daemon last
// published as held, whose pod the API server confirmed gone (see
// checkLeaks), sorted. It is empty while the part is disabled, unsynced or
// degraded. It never blocks on the API server.
func (c *Cluster) PodsGone() []api.Key {
	if !c.synced() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]api.Key, 0, len(c.leaks.confirmed))
	for k := range c.leaks.confirmed {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b api.Key) int { return strings.Compare(a.String(), b.String()) })
	return out
}

func (c *Cluster) forget(k api.Key) {
	c.mu.Lock()
	delete(c.leaks.goneAt, k)
	delete(c.leaks.confirmed, k)
	c.mu.Unlock()
}
