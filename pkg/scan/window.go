package scan

import (
	"context"
	"errors"
	"sync"

	"github.com/settle/settle/pkg/chain"
)

// windowGrowAfter: answered windows in a row before a shrunk window
// doubles again. A node that refuses above some size then wastes one call
// in this many plus one, and a window shrunk by one huge block recovers
// within a few passes.
const windowGrowAfter = 8

// window is the block count of a network's eth_getLogs: halved when the
// node (or settle's own cap) refuses the answer as too large, down to one
// block; doubled back towards its maximum after windowGrowAfter answers.
// Cursor and rescan passes share it (same node, same limits).
type window struct {
	mu      sync.Mutex
	blocks  uint64
	max     uint64
	answers int
}

func newWindow(blocksMax uint64) *window {
	blocksMax = max(blocksMax, 1)
	return &window{blocks: blocksMax, max: blocksMax}
}

func (w *window) size() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.blocks
}

// refused: a window of asked blocks was refused.
func (w *window) refused(asked uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.blocks = max(min(w.blocks, asked)/2, 1)
	w.answers = 0
}

// answered: a window of asked blocks was answered. A shorter one (the
// rest of a range) says nothing about the current size.
func (w *window) answered(asked uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if asked < w.blocks || w.blocks >= w.max {
		return
	}
	if w.answers++; w.answers >= windowGrowAfter {
		w.blocks, w.answers = min(w.blocks*2, w.max), 0
	}
}

// windowed reads r in windows of w's size, in order, each block once: a
// window refused with chain.ErrLogsLimit is asked again at half the size;
// one block still refused goes to single (nil: the refusal is the error).
func windowed(ctx context.Context, r span, w *window, refusedHook func(), read, single func(context.Context, span) error) error {
	from := r.from
	for {
		to := r.to
		if size := w.size(); to-from >= size {
			to = from + size - 1
		}
		err := read(ctx, span{from, to})
		if errors.Is(err, chain.ErrLogsLimit) {
			refusedHook()
			if to > from {
				w.refused(to - from + 1)
				continue
			}
			if single == nil {
				return err
			}
			err = single(ctx, span{from, to})
		} else if err == nil {
			w.answered(to - from + 1)
		}
		if err != nil {
			return err
		}
		if to >= r.to {
			return nil
		}
		from = to + 1
	}
}
