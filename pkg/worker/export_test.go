package worker

import (
	"time"

	"github.com/settle/settle/pkg/task"
)

// Exported for the external tests.
const DoneHold = doneHold

// DoneScriptSHA is the SHA of the done script the waker defers.
var DoneScriptSHA = doneScriptSHA

// HeldDones is how many dones the waker holds.
func (w *Waker) HeldDones() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.dones)
}

// HoldDonesFor sets how long dones wait for a dequeue; call it before
// the first.
func (w *Waker) HoldDonesFor(d time.Duration) {
	w.mu.Lock()
	w.doneHold = d
	w.mu.Unlock()
}

// BoundBatches sets the bound of one ledger transaction; call it before
// the first submit.
func (b *Batcher) BoundBatches(d time.Duration) { b.timeout = d }

// Quiet reports whether the waker takes queue as empty without asking
// Redis (its quiet mark has not run out).
func (w *Waker) Quiet(queue string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.quiet[task.PendingListKey(queue)]
	return ok && time.Since(at) < w.quietFor()
}

// QuietLeft is how long the waker still takes queue as empty without
// asking Redis (0: it asks).
func (w *Waker) QuietLeft(queue string) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.quiet[task.PendingListKey(queue)]
	if !ok {
		return 0
	}
	return max(w.quietFor()-time.Since(at), 0)
}
