package notify

import "time"

// SetRequestTimeout shortens a deliverer's request bound, for tests of a
// receiver that never answers.
func SetRequestTimeout(d *Deliverer, timeout time.Duration) {
	d.requestTimeout = timeout
	d.client.Timeout = timeout
}
