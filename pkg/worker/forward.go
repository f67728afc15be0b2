package worker

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// asynq's forwarder moves due retries and scheduled tasks into the
// pending lists: every DelayedTaskCheckInterval (1 s here) it runs its
// forward script on each queue's retry and scheduled sets in turn, six
// round trips for three queues, almost always moving nothing (an idle
// worker's largest share of Redis commands). The forward plan asks
// Redis once per round, in one pipeline, how many tasks are due in every
// set the forwarder has named so far, and answers the scripts of the
// sets with none itself. A set with due tasks gets the real script, and
// so does a set seen for the first time, or every set when the question
// fails: a task is never moved later than the next round.

// Forward plan bounds.
const (
	// forwardPlanFresh is how long one answer serves the forwarder: its
	// round of scripts takes a few milliseconds, its rounds come a
	// second apart, so an answer never serves the next round.
	forwardPlanFresh = 100 * time.Millisecond
	// forwardBatch is how many tasks asynq's forward script moves at
	// most per run (asynq v0.26.0: LIMIT 0, 100); a run that moved fewer
	// left none due, and the forwarder's follow-up run is answered here.
	forwardBatch = 100
	// forwardSetsMax bounds the sets the plan asks about (two per queue).
	forwardSetsMax = 64
)

type forwardPlan struct {
	mu sync.Mutex
	at time.Time
	// due holds every set seen: whether it had due tasks at the last
	// answer (true for a set not yet asked about).
	due map[string]bool
	// asked and answered count the plan's questions and the scripts it
	// answered (for tests).
	asked, answered int64
}

// skip reports whether the forward script on set, run with the unix time
// now, can be answered "nothing moved" without running it.
func (p *forwardPlan) skip(ctx context.Context, rdb redis.UniversalClient, set string, now int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.due == nil {
		p.due = map[string]bool{}
	}
	if _, seen := p.due[set]; !seen {
		if len(p.due) < forwardSetsMax {
			p.due[set] = true
		}
		return false
	}
	if time.Since(p.at) >= forwardPlanFresh {
		if !p.ask(ctx, rdb, now) {
			return false
		}
	}
	if p.due[set] {
		return false
	}
	p.answered++
	return true
}

// ask counts the due tasks of every set seen, as the forward script's
// ZRANGEBYSCORE -inf now would find them.
func (p *forwardPlan) ask(ctx context.Context, rdb redis.UniversalClient, now int64) bool {
	upTo := strconv.FormatInt(now, 10)
	pipe := rdb.Pipeline()
	counts := make(map[string]*redis.IntCmd, len(p.due))
	for set := range p.due {
		counts[set] = pipe.ZCount(ctx, set, "-inf", upTo)
	}
	p.asked++
	if _, err := pipe.Exec(ctx); err != nil {
		for set := range p.due {
			p.due[set] = true
		}
		p.at = time.Time{}
		return false
	}
	for set, c := range counts {
		p.due[set] = c.Val() > 0
	}
	p.at = time.Now()
	return true
}

// ran books a real run of the script on set that moved moved tasks.
func (p *forwardPlan) ran(set string, moved int64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, seen := p.due[set]; seen && err == nil && moved < forwardBatch {
		p.due[set] = false
	}
}

// ForwardsAnswered is how many forward scripts the plan answered without
// Redis, and ForwardPlans how many questions it asked (for tests).
func (w *Waker) ForwardsAnswered() int64 {
	w.plan.mu.Lock()
	defer w.plan.mu.Unlock()
	return w.plan.answered
}

// ForwardPlans: see ForwardsAnswered.
func (w *Waker) ForwardPlans() int64 {
	w.plan.mu.Lock()
	defer w.plan.mu.Unlock()
	return w.plan.asked
}
