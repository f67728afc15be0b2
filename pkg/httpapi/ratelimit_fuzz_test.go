package httpapi_test

import (
	"slices"
	"testing"
	"time"

	"github.com/settle/settle/pkg/httpapi"
)

// FuzzParseRateLimit: a rate limit setting is refused, or read into
// windows of known periods, each once, with limits of at least 1, that
// read back the same from how they are shown (the api logs that form).
func FuzzParseRateLimit(f *testing.F) {
	for _, seed := range []string{"30/s,300/m", "off", " 5/h ", "0/s", "+1/s", "1/s,2/s", "1/d", "", "007/m", "9999999999/s"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		limit, err := httpapi.ParseRateLimit(s)
		if err != nil {
			return
		}
		var periods []time.Duration
		for _, w := range limit {
			if w.Limit < 1 || slices.Contains(periods, w.Period) ||
				(w.Period != time.Second && w.Period != time.Minute && w.Period != time.Hour) {
				t.Fatalf("%q read as %+v", s, limit)
			}
			periods = append(periods, w.Period)
		}
		again, err := httpapi.ParseRateLimit(limit.String())
		if err != nil || !slices.Equal(again, limit) {
			t.Fatalf("%q shown as %q reads back as %+v (%v)", s, limit.String(), again, err)
		}
	})
}
