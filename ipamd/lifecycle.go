package ipamd

import (
	"sync"
	"sync/atomic"
)

// lifecycle is the daemon's readiness and shutdown: the worker marks it
// ready (or why not), Run marks it stopping; every part reads it.
type lifecycle struct {
	ready    chan struct{} // closed once state is restored and first reconciled
	readyOK  atomic.Bool
	closing  chan struct{} // closed when shutdown begins: waiting ADDs answer at once
	stopping atomic.Bool   // shutdown began: no new cloud changes
	stopOnce sync.Once     // closes closing

	mu     sync.Mutex // guards reason
	reason string     // why not ready
}

func newLifecycle() *lifecycle {
	return &lifecycle{ready: make(chan struct{}), closing: make(chan struct{}), reason: "restoring state"}
}

// setReady marks the daemon ready (or not, with a reason).
func (l *lifecycle) setReady(ok bool, reason string) {
	l.mu.Lock()
	l.reason = reason
	l.mu.Unlock()
	if ok && l.readyOK.CompareAndSwap(false, true) {
		close(l.ready)
	}
}

// notReadyReason is why the daemon is not ready ("" once it is).
func (l *lifecycle) notReadyReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

// stop begins shutdown: no new cloud changes, waiting ADDs answer now.
func (l *lifecycle) stop() {
	l.stopping.Store(true)
	l.stopOnce.Do(func() { close(l.closing) })
}
