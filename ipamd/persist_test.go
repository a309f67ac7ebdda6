package ipamd

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/checkpoint"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/provider"
)

// TestCheckpointSyncFollowsWrites: each persist replaces the file before it
// returns (the next daemon would load it); the fsyncs of a burst of writes
// come later and are shared: one or two for twenty writes, none without a
// write, and the final persistDurable syncs at once.
func TestCheckpointSyncFollowsWrites(t *testing.T) {
	store := datastore.New(0)
	store.Sync([]provider.ENI{testENI}, time.Now())
	m := NewMetrics(prometheus.NewRegistry())
	c := &checkpointer{path: filepath.Join(t.TempDir(), "ipam.json"), store: store, log: slog.New(slog.DiscardHandler),
		metrics: m, now: time.Now, syncReq: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.syncLoop(ctx); close(done) }()

	count := func(outcome string) int { return int(testutil.ToFloat64(m.checkpoints.WithLabelValues(outcome))) }
	keys := []api.Key{{Network: "vpcip", ContainerID: "c0", IfName: "eth0"}}
	if _, _, err := store.Assign(keys[0], api.Pod{Namespace: "default", Name: "p0"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := c.persist(); err != nil {
			t.Fatal(err)
		}
		st, _, err := checkpoint.Load(c.path)
		if err != nil || len(st.Assignments) != 1 {
			t.Fatalf("write %d: Load = %d assignments, %v; want the written one", i, len(st.Assignments), err)
		}
		store.Release(keys[0], time.Now())
		if _, _, err := store.Assign(keys[0], api.Pod{Namespace: "default", Name: "p0"}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if w := count("ok"); w != 20 {
		t.Errorf("%d writes counted, want 20", w)
	}
	if s := count("synced"); s > 1 {
		t.Errorf("%d fsyncs right after the writes, want them delayed (syncDelay %v)", s, syncDelay)
	}
	deadline := time.Now().Add(3 * syncDelay)
	for count("synced") == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if s := count("synced"); s < 1 || s > 2 {
		t.Errorf("%d fsyncs for a burst of 20 writes, want 1 or 2", s)
	}
	time.Sleep(syncDelay + 200*time.Millisecond)
	before := count("synced")
	time.Sleep(syncDelay + 200*time.Millisecond)
	if after := count("synced"); after != before {
		t.Errorf("fsyncs went on without writes: %d then %d", before, after)
	}
	cancel()
	<-done
	store.Release(keys[0], time.Now())
	if err := c.persistDurable(); err != nil {
		t.Fatal(err)
	}
	if s := count("synced"); s != before+1 {
		t.Errorf("persistDurable: %d fsyncs, want %d", s, before+1)
	}
}
