package ipamd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vpcip/vpcip/ipamd/checkpoint"
	"github.com/vpcip/vpcip/ipamd/datastore"
)

// restoreOutcome is how the checkpoint load went.
type restoreOutcome int

const (
	restoredNone    restoreOutcome = iota // no checkpoint: a new node
	restoredOK                            // loaded
	restoredCorrupt                       // moved aside: rebuild from cloud and host, cool every free address
)

// checkpointer owns the checkpoint file: it loads it into the datastore at
// start and writes it after changes. Every goroutine that changes the
// datastore calls persist; writes are serialized and fold.
type checkpointer struct {
	path    string
	save    func(string, checkpoint.State) error // checkpoint.Save; tests replace it
	store   *datastore.Store
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time

	mu           sync.Mutex // serializes writes; guards the fields below
	savedGen     uint64     // datastore generation of the last write
	instance     string     // instance id written into the checkpoint
	restoredFrom string     // instance id recorded in the loaded checkpoint, until start-up checks it
	// unknown are the loaded file's fields this build does not know
	// (checkpoint.State.Unknown), written back with every write.
	unknown map[string]json.RawMessage

	failed atomic.Pointer[writeFailure] // the last write's failure; nil once a write succeeds
}

// writeFailure is a checkpoint write that failed, and when.
type writeFailure struct {
	err error
	at  time.Time
}

// failure is the outstanding write failure, nil once a later write
// succeeded: every ADD fails meanwhile (it records an assignment before
// answering). Any goroutine.
func (c *checkpointer) failure() *writeFailure {
	if c == nil {
		return nil
	}
	return c.failed.Load()
}

// load loads the checkpoint into the (empty) datastore. A damaged file is
// moved aside with a logged reason and never fails the start.
func (c *checkpointer) load() (restoreOutcome, error) {
	st, dropped, err := checkpoint.Load(c.path)
	var ce *checkpoint.CorruptError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.log.Info("no checkpoint: starting as a new node", "path", c.path)
		return restoredNone, nil
	case errors.As(err, &ce):
		to, qerr := checkpoint.Quarantine(c.path, c.now())
		if qerr != nil {
			return 0, fmt.Errorf("checkpoint %s is corrupt (%s) and cannot be moved aside: %w", c.path, ce.Reason, qerr)
		}
		c.log.Error("checkpoint corrupt: moved aside, rebuilding from the cloud and host pod routes",
			"path", c.path, "reason", ce.Reason, "movedTo", to)
		c.metrics.repaired("corrupt_checkpoint", 1)
		return restoredCorrupt, nil
	case err != nil:
		// Unreadable for another reason (permissions, I/O): keep the file
		// for the operator and rebuild.
		c.log.Error("checkpoint unreadable: rebuilding from the cloud and host pod routes", "path", c.path, "err", err)
		return restoredCorrupt, nil
	}
	for _, why := range dropped {
		c.log.Error("checkpoint entry dropped", "path", c.path, "reason", why)
	}
	c.metrics.repaired("checkpoint_entry_dropped", len(dropped))
	if err := c.store.Recovery().Restore(st); err != nil {
		return 0, err
	}
	c.mu.Lock()
	c.restoredFrom, c.unknown = st.InstanceID, st.Unknown
	c.mu.Unlock()
	c.log.Info("checkpoint loaded", "path", c.path, "assignments", len(st.Assignments), "cooling", len(st.Cooling), "written", st.Written,
		"writer", st.Writer.Program+" "+st.Writer.Build, "writerPID", st.Writer.PID, "generation", st.Generation)
	if len(dropped) > 0 {
		return restoredCorrupt, nil
	}
	return restoredOK, nil
}

// adoptInstance records self as the checkpoint's instance and discards a
// restored checkpoint written on another instance (a reused disk or image):
// its assignments mean nothing here. It reports whether it discarded one.
func (c *checkpointer) adoptInstance(self string) bool {
	c.mu.Lock()
	from := c.restoredFrom
	c.restoredFrom, c.instance = "", self
	if from != "" && from != self {
		c.unknown = nil // another instance's: nothing in it is this node's
	}
	c.mu.Unlock()
	if from == "" || from == self {
		return false
	}
	c.store.Recovery().Reset()
	to, err := checkpoint.Quarantine(c.path, c.now())
	c.log.Error("checkpoint was written on another instance: discarded, rebuilding from the cloud and host pod routes",
		"checkpointInstance", from, "instance", self, "movedTo", to, "moveErr", err)
	c.metrics.repaired("foreign_checkpoint", 1)
	return true
}

// persist writes the checkpoint if the datastore changed since the last
// write. Concurrent callers fold: whoever writes records every change made
// before it took the snapshot.
func (c *checkpointer) persist() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := c.store.Generation(); g == c.savedGen && g != 0 {
		return nil
	}
	st, gen := c.store.Recovery().Checkpoint(c.now())
	if gen == c.savedGen && gen != 0 {
		return nil
	}
	st.InstanceID, st.Unknown = c.instance, c.unknown
	save := c.save
	if save == nil {
		save = checkpoint.Save
	}
	if err := save(c.path, st); errors.Is(err, checkpoint.ErrNotDurable) {
		// The file holds this state: failing the caller would undo a
		// change the file keeps (see ErrNotDurable).
		c.metrics.checkpoints.WithLabelValues("not_durable").Inc()
		c.log.Warn("checkpoint written but its directory could not be synced; kept as written", "path", c.path, "err", err)
	} else if err != nil {
		c.metrics.checkpoints.WithLabelValues("error").Inc()
		if c.failed.Swap(&writeFailure{err: err, at: c.now()}) == nil {
			c.log.Error("checkpoint cannot be written: ADDs fail until it can (written again at each ADD, DEL and reconciliation)", "path", c.path, "err", err)
		}
		return err
	}
	c.metrics.checkpoints.WithLabelValues("ok").Inc()
	c.savedGen = gen
	if c.failed.Swap(nil) != nil {
		c.log.Info("checkpoint written again after failed writes", "path", c.path)
	}
	return nil
}
