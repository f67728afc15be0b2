package test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/task"
)

func flushRedis(t *testing.T, url string) {
	t.Helper()
	rdb, err := redisconn.Open(url)
	require.NoError(t, err)
	defer rdb.Close()
	require.NoError(t, rdb.FlushDB(context.Background()).Err())
}

// queuedTasks counts payment tasks waiting in asynq.
func queuedTasks(t *testing.T, url string) int {
	t.Helper()
	rdb, err := redisconn.Open(url)
	require.NoError(t, err)
	defer rdb.Close()
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(task.QueuePayments)
	if err != nil {
		return 0
	}
	return info.Pending
}

// jsonField reads one top-level field of a JSON log line as text.
func jsonField(line, name string) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		return ""
	}
	switch v := m[name].(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case nil:
		return ""
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

// alertSink is an ALERT_WEBHOOK_URL receiver.
type alertSink struct {
	URL  string
	mu   sync.Mutex
	keys []string
}

func newAlertSink(t *testing.T) *alertSink {
	a := &alertSink{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg struct {
			Key string `json:"key"`
		}
		_ = json.Unmarshal(body, &msg)
		a.mu.Lock()
		a.keys = append(a.keys, msg.Key)
		a.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	a.URL = srv.URL
	return a
}

func (a *alertSink) waitFor(t *testing.T, key string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		for _, k := range a.keys {
			if k == key {
				a.mu.Unlock()
				return
			}
		}
		a.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	t.Fatalf("no %q alert within %s; got %v", key, timeout, a.keys)
}
