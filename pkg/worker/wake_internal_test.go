package worker

import (
	"strings"
	"testing"

	"github.com/settle/settle/pkg/task"
)

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

// FuzzWokenQueue: a wake-up names one of the other queues or none; a
// payload never makes the waker track a key of its own choosing.
func FuzzWokenQueue(f *testing.F) {
	for _, seed := range []string{"", "1", "queue:", "queue:notifications", "queue:maintenance", "queue:payments", "queue:other", "queue:notifications ", "QUEUE:maintenance"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		key, ok := wokenQueue(payload)
		if !ok {
			return
		}
		q := strings.TrimPrefix(payload, task.WakeQueuePrefix)
		if _, known := QueueWeights[q]; !known || q == task.QueuePayments || key != task.PendingListKey(q) {
			t.Fatalf("wokenQueue(%q) = %q", payload, key)
		}
	})
}

func TestWokenQueue(t *testing.T) {
	for payload, want := range map[string]string{
		"queue:notifications": task.PendingListKey(task.QueueNotifications),
		"queue:maintenance":   task.PendingListKey(task.QueueMaintenance),
		"queue:payments":      "", "queue:other": "", "": "", "3": "", "notifications": "",
	} {
		got, ok := wokenQueue(payload)
		if got != want || ok != (want != "") {
			t.Errorf("wokenQueue(%q) = %q, %v; want %q", payload, got, ok, want)
		}
	}
}
