package ipamd

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/vpcip/vpcip/ipamd/checkpoint"
)

// restoreOutcome is how the checkpoint load went.
type restoreOutcome int

const (
	restoredNone    restoreOutcome = iota // no checkpoint: a new node
	restoredOK                            // loaded
	restoredCorrupt                       // moved aside: rebuild from cloud and host, cool every free address
)

// loadCheckpoint loads the checkpoint into the (empty) datastore. A damaged
// file is moved aside with a logged reason and never fails the start.
func (d *Daemon) loadCheckpoint() (restoreOutcome, error) {
	path := d.cfg.Checkpoint
	st, dropped, err := checkpoint.Load(path)
	var ce *checkpoint.CorruptError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		d.log.Info("no checkpoint: starting as a new node", "path", path)
		return restoredNone, nil
	case errors.As(err, &ce):
		to, qerr := checkpoint.Quarantine(path, d.now())
		if qerr != nil {
			return 0, fmt.Errorf("checkpoint %s is corrupt (%s) and cannot be moved aside: %w", path, ce.Reason, qerr)
		}
		d.log.Error("checkpoint corrupt: moved aside, rebuilding from the cloud and host pod routes",
			"path", path, "reason", ce.Reason, "movedTo", to)
		d.metrics.repaired("corrupt_checkpoint", 1)
		return restoredCorrupt, nil
	case err != nil:
		// Unreadable for another reason (permissions, I/O): keep the file
		// for the operator and rebuild.
		d.log.Error("checkpoint unreadable: rebuilding from the cloud and host pod routes", "path", path, "err", err)
		return restoredCorrupt, nil
	}
	for _, why := range dropped {
		d.log.Error("checkpoint entry dropped", "path", path, "reason", why)
	}
	d.metrics.repaired("checkpoint_entry_dropped", len(dropped))
	if err := d.store.Restore(st); err != nil {
		return 0, err
	}
	d.mu.Lock()
	d.restoredFrom = st.InstanceID
	d.mu.Unlock()
	d.log.Info("checkpoint loaded", "path", path, "assignments", len(st.Assignments), "cooling", len(st.Cooling), "written", st.Written)
	if len(dropped) > 0 {
		return restoredCorrupt, nil
	}
	return restoredOK, nil
}

// dropForeign discards a restored checkpoint written on another instance
// (a reused disk or image): its assignments mean nothing here. It reports
// whether it did.
func (d *Daemon) dropForeign(self string) bool {
	d.mu.Lock()
	from := d.restoredFrom
	d.restoredFrom = ""
	d.mu.Unlock()
	if from == "" || from == self {
		return false
	}
	d.store.Reset()
	to, err := checkpoint.Quarantine(d.cfg.Checkpoint, d.now())
	d.log.Error("checkpoint was written on another instance: discarded, rebuilding from the cloud and host pod routes",
		"checkpointInstance", from, "instance", self, "movedTo", to, "moveErr", err)
	d.metrics.repaired("foreign_checkpoint", 1)
	return true
}

// persist writes the checkpoint if the datastore changed since the last
// write. Concurrent callers fold: whoever writes records every change made
// before it took the snapshot.
func (d *Daemon) persist() error {
	d.persistMu.Lock()
	defer d.persistMu.Unlock()
	if g := d.store.Generation(); g == d.savedGen && g != 0 {
		return nil
	}
	st, gen := d.store.Checkpoint(d.now())
	if gen == d.savedGen && gen != 0 {
		return nil
	}
	st.InstanceID, _ = d.instance.Load().(string)
	if err := checkpoint.Save(d.cfg.Checkpoint, st); err != nil {
		d.metrics.checkpoints.WithLabelValues("error").Inc()
		return err
	}
	d.metrics.checkpoints.WithLabelValues("ok").Inc()
	d.savedGen = gen
	return nil
}
