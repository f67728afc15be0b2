package service

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestWaitForSchema: worker and scheduler wait at start on a database
// not migrated yet, saying what to run, return once it is, and stop
// waiting when told to (canceled, which service.Main takes for a clean
// stop).
func TestWaitForSchema(t *testing.T) {
	ctx := context.Background()
	db := testenv.OpenDB(t, testenv.EmptyDatabaseURL(t))
	out := &syncBuffer{}
	log := zerolog.New(out)

	stopCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- WaitForSchema(stopCtx, db, log) }()
	done := make(chan error, 1)
	go func() { done <- WaitForSchema(ctx, db, log) }()

	deadline := time.Now().Add(10 * time.Second)
	for !bytes.Contains([]byte(out.String()), []byte("run `api migrate` (or `settlectl migrate`)")) {
		require.True(t, time.Now().Before(deadline), "no word of `api migrate`: %s", out.String())
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	select {
	case err := <-stopped:
		require.True(t, errors.Is(err, context.Canceled), "%v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("a stop did not end the wait")
	}
	select {
	case err := <-done:
		t.Fatalf("returned (%v) before the schema was current", err)
	default:
	}

	_, err := db.Migrate(ctx)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(schemaPoll + 5*time.Second):
		t.Fatal("still waiting after the migration")
	}
	require.Contains(t, out.String(), "database schema is current")
}
