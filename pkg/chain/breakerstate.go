package chain

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Shared breaker states as ReadBreakerState names them.
const (
	BreakerClosed   = "closed"
	BreakerOpen     = "open"
	BreakerHalfOpen = "half_open"
)

// ReadBreakerState reads a breaker's shared state from Redis without
// calling through it (the operator console): two EXISTS, no script, no
// effect on the breaker. It is what every worker sharing Redis sees; a
// worker cut off from Redis decides alone and may differ.
func ReadBreakerState(ctx context.Context, rdb redis.UniversalClient, name string) (string, error) {
	if name == "" {
		name = BreakerNameDefault
	}
	prefix := breakerKeyPrefix(name)
	pipe := rdb.Pipeline()
	tripped := pipe.Exists(ctx, prefix+"tripped")
	open := pipe.Exists(ctx, prefix+"open")
	if _, err := pipe.Exec(ctx); err != nil {
		return "", fmt.Errorf("read breaker %s: %w", name, err)
	}
	switch {
	case tripped.Val() == 0:
		return BreakerClosed, nil
	case open.Val() == 1:
		return BreakerOpen, nil
	}
	return BreakerHalfOpen, nil
}

// breakerKeyPrefix is the Redis key prefix of a breaker's shared state;
// newBreaker's keys and TestReadBreakerState keep the two in step.
func breakerKeyPrefix(name string) string { return "settle:chain:breaker:{" + name + "}:" }
