package worker

import "testing"

// FuzzAnnouncedTasks: whatever a wake-up carries (anyone who can publish
// on the channel writes it), the count is one task at least and bounded.
func FuzzAnnouncedTasks(f *testing.F) {
	for _, seed := range []string{"", "1", "32", "0", "-3", "99999999999999999999", "1e3", " 7", "x"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		n := announcedTasks(payload)
		if n < 1 || n > unknownTasks {
			t.Fatalf("announcedTasks(%q) = %d, outside 1..%d", payload, n, unknownTasks)
		}
	})
}

func TestAnnouncedTasks(t *testing.T) {
	for payload, want := range map[string]int{"": unknownTasks, "1": 1, "32": 32, "0": unknownTasks, "-1": unknownTasks, "x": unknownTasks, "4000000": unknownTasks} {
		if got := announcedTasks(payload); got != want {
			t.Errorf("announcedTasks(%q) = %d, want %d", payload, got, want)
		}
	}
}
