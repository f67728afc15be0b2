package worker

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// After a handler returns, asynq marks its task done with a script of its
// own: a Redis round trip, and at a trickle a wake-up of the worker for
// its answer, that nothing waits for (the event is already terminal in
// PostgreSQL). The Waker answers a payments task's done at once and sends
// the script in the same round trip as the processor's next dequeue of
// the payments queue, which at a trickle is the one the next task's
// wake-up sets off. A done that finds no dequeue to go with within
// doneHold goes on its own.
//
// A done that never reaches Redis (the process is killed first, or Redis
// fails it doneAttempts times) leaves its task active until its lease
// runs out; asynq's recoverer then hands it back, and the ledger answers
// it already done. Money is never at stake; the cost is a task run twice.

// Done deferral bounds.
const (
	// doneHold is the longest a deferred done waits for a dequeue.
	doneHold = 100 * time.Millisecond
	// donesMax bounds the dones held at once; beyond it they go at once.
	donesMax = 256
	// doneAttempts is how many round trips a done gets before it is left
	// to asynq's lease recovery.
	doneAttempts = 3
	// doneFlushTimeout bounds a round trip of dones sent on their own.
	doneFlushTimeout = 5 * time.Second
	// doneKeys is the key count of asynq's done script.
	doneKeys = 5
)

// doneScriptSource is asynq v0.26.0's done script (internal/rdb, doneCmd,
// MIT licence), byte for byte: only a script with its SHA is deferred, so
// an asynq whose script differs is left alone, and a deferred done that
// meets NOSCRIPT (Redis restarted, or its scripts flushed) is sent again
// with the source. TestDoneScriptIsAsynqs checks it against asynq.
const doneScriptSource = `
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[2], ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
if redis.call("DEL", KEYS[3]) == 0 then
  return redis.error_reply("NOT FOUND")
end
local n = redis.call("INCR", KEYS[4])
if tonumber(n) == 1 then
	redis.call("EXPIREAT", KEYS[4], ARGV[2])
end
local total = redis.call("GET", KEYS[5])
if tonumber(total) == tonumber(ARGV[3]) then
	redis.call("SET", KEYS[5], 1)
else
	redis.call("INCR", KEYS[5])
end
return redis.status_reply("OK")
`

var doneScriptSHA = redis.NewScript(doneScriptSource).Hash()

// heldDone is a deferred done script and the round trips it has had.
type heldDone struct {
	args     []any
	attempts int
}

// isDone reports whether cmd is asynq's done script for a task of the
// queue whose active list is active:
// EVALSHA <sha> 5 <active> <lease> <task> <processed:day> <processed> <id> ...
func isDone(cmd redis.Cmder, active string) bool {
	if cmd.Name() != "evalsha" {
		return false
	}
	args := cmd.Args()
	if len(args) < 3+doneKeys+1 {
		return false
	}
	sha, _ := args[1].(string)
	n, _ := args[2].(int)
	key, _ := args[3].(string)
	return n == doneKeys && strings.EqualFold(sha, doneScriptSHA) && key == active
}

// holdDone defers cmd, answering it as Redis would have; false when it
// must go now (stopping, or too many held).
func (w *Waker) holdDone(cmd redis.Cmder) bool {
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopping || len(w.dones) >= donesMax {
		return false
	}
	w.dones = append(w.dones, heldDone{args: append([]any(nil), cmd.Args()...)})
	if len(w.dones) == 1 {
		if w.doneTimer == nil {
			w.doneTimer = time.AfterFunc(w.doneHold, w.flushDones)
		} else {
			w.doneTimer.Reset(w.doneHold)
		}
	}
	c.SetVal("OK")
	return true
}

// heldNone reports whether no done is held.
func (w *Waker) heldNone() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.dones) == 0
}

// takeDones hands over the held dones.
func (w *Waker) takeDones() []heldDone {
	w.mu.Lock()
	defer w.mu.Unlock()
	dones := w.dones
	w.dones = nil
	if len(dones) > 0 && w.doneTimer != nil {
		w.doneTimer.Stop()
	}
	return dones
}

// lookWithDones runs a dequeue of the payments queue, with the held dones
// in front of it in the same round trip.
func (w *Waker) lookWithDones(ctx context.Context, next redis.ProcessHook, cmd redis.Cmder) error {
	if w.heldNone() {
		return next(ctx, cmd)
	}
	// Under flushMu, so that Stop returns only once these have landed.
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	dones := w.takeDones()
	if len(dones) == 0 {
		return next(ctx, cmd)
	}
	cmds := w.sendDones(ctx, w.rdb, dones, cmd)
	w.settleDones(ctx, dones, cmds)
	return cmd.Err()
}

// sendDones sends the dones, then extra, as one pipeline on client, and
// returns the dones' commands.
func (w *Waker) sendDones(ctx context.Context, client redis.UniversalClient, dones []heldDone, extra ...redis.Cmder) []redis.Cmder {
	pipe := client.Pipeline()
	cmds := make([]redis.Cmder, len(dones))
	for i, d := range dones {
		cmds[i] = redis.NewCmd(ctx, d.args...)
		_ = pipe.Process(ctx, cmds[i])
	}
	for _, c := range extra {
		_ = pipe.Process(ctx, c)
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	return cmds
}

// flushDones sends the held dones on their own: no dequeue came in time,
// or the worker is stopping.
func (w *Waker) flushDones() {
	// Stop's flush waits for the timer's and a look's, so the process
	// does not end with dones on the wire.
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	dones := w.takeDones()
	if len(dones) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), doneFlushTimeout)
	defer cancel()
	w.settleDones(ctx, dones, w.sendDones(ctx, w.rdb, dones))
}

// settleDones books the answers of sent dones: NOSCRIPT is sent again
// with the source, a failed round trip is held again until its attempts
// run out, and asynq's own NOT FOUND (the task was recovered meanwhile)
// ends it.
func (w *Waker) settleDones(ctx context.Context, dones []heldDone, cmds []redis.Cmder) {
	var again []heldDone
	for i, c := range cmds {
		err := c.Err()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			args := append([]any{"eval", doneScriptSource}, dones[i].args[2:]...)
			retry := redis.NewCmd(ctx, args...)
			_ = w.rdb.Process(ctx, retry)
			err = retry.Err()
		}
		switch {
		case err == nil:
		case strings.Contains(err.Error(), "NOT FOUND"):
			w.log.Debug().Err(err).Msg("a deferred task done found its task gone; asynq recovered it")
		case dones[i].attempts+1 < doneAttempts:
			dones[i].attempts++
			again = append(again, dones[i])
		default:
			w.donesLost.Add(1)
			w.log.Warn().Err(err).Msg("a task's done did not reach Redis; asynq hands the task back when its lease runs out, and it runs again as already done")
		}
	}
	if len(again) == 0 {
		return
	}
	w.mu.Lock()
	stopping := w.stopping
	if !stopping {
		w.dones = append(again, w.dones...)
		w.doneTimer.Reset(w.doneHold)
	}
	w.mu.Unlock()
	if stopping {
		w.donesLost.Add(int64(len(again)))
		w.log.Warn().Int("tasks", len(again)).Msg("tasks' dones did not reach Redis before the stop; asynq hands them back when their leases run out")
	}
}

// DonesLost is how many deferred dones never reached Redis.
func (w *Waker) DonesLost() int64 { return w.donesLost.Load() }
