package periodic

import "time"

// SetClock gives r a clock of its own, as a replica whose clock is off.
func SetClock(r *Runner, now func() time.Time) { r.clock = now }

// SetClaimTimeout bounds r's period claims by d.
func SetClaimTimeout(r *Runner, d time.Duration) { r.claimWithin = d }
