package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/postgres"
)

const (
	// RecoveryResumeKey holds where the last stale recovery run stopped
	// at its page bound, for whichever scheduler replica runs the next.
	RecoveryResumeKey = "settle:recovery:resume"
	// recoveryResumeTTL forgets a resume point no run has used for long:
	// the next run then starts from the oldest, which only delays.
	recoveryResumeTTL = time.Hour
)

// RedisRecovery is the Redis side of stale recovery beyond the
// Inspector: asynq's task leases and the shared resume point.
type RedisRecovery struct {
	Redis redis.UniversalClient
}

// leaseKey is asynq v0.26's sorted set of active tasks' leases, scored by
// expiry in Unix seconds (its internal base.LeaseKey, not exported).
func leaseKey(queue string) string { return "asynq:{" + queue + "}:lease" }

// LeaseExpiry says until when a worker holds the active task id; ok is
// false when the task has no lease.
func (q RedisRecovery) LeaseExpiry(ctx context.Context, queue, id string) (time.Time, bool, error) {
	score, err := q.Redis.ZScore(ctx, leaseKey(queue), id).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return time.Unix(int64(score), 0), true, nil
}

// LoadResume reads the shared resume point; none is the zero cursor.
func (q RedisRecovery) LoadResume(ctx context.Context) (postgres.StaleCursor, error) {
	v, err := q.Redis.Get(ctx, RecoveryResumeKey).Result()
	if errors.Is(err, redis.Nil) {
		return postgres.StaleCursor{}, nil
	}
	if err != nil {
		return postgres.StaleCursor{}, err
	}
	micros, id, ok := strings.Cut(v, " ")
	n, perr := strconv.ParseInt(micros, 10, 64)
	if !ok || perr != nil {
		return postgres.StaleCursor{}, fmt.Errorf("recovery resume point %q unreadable", v)
	}
	return postgres.StaleCursor{UpdatedAt: time.UnixMicro(n).UTC(), EventID: id}, nil
}

// SaveResume stores the resume point; the zero cursor removes it.
func (q RedisRecovery) SaveResume(ctx context.Context, c postgres.StaleCursor) error {
	if c.UpdatedAt.IsZero() && c.EventID == "" {
		return q.Redis.Del(ctx, RecoveryResumeKey).Err()
	}
	// Microseconds: PostgreSQL's precision, so the cursor is exact.
	return q.Redis.Set(ctx, RecoveryResumeKey, strconv.FormatInt(c.UpdatedAt.UnixMicro(), 10)+" "+c.EventID, recoveryResumeTTL).Err()
}
