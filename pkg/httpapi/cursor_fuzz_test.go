package httpapi_test

import (
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/postgres"
)

// A cursor is outside input: whatever decodes is exactly what the
// encoder writes for it (one spelling per position), and every position
// survives the round trip.
func FuzzEventCursor(f *testing.F) {
	f.Add("", uint64(0), "evt-1")
	f.Add(httpapi.EncodeEventCursor(postgres.EventKey{XID: 736, EventID: "a:b/c"}), uint64(736), "a:b/c")
	f.Add("ZTE6MDE6eA", uint64(1), "x")
	f.Fuzz(func(t *testing.T, cursor string, xid uint64, id string) {
		if key, ok := httpapi.DecodeEventCursor(cursor); ok {
			require.Equal(t, cursor, httpapi.EncodeEventCursor(key))
		}
		if id == "" || !utf8.ValidString(id) || utf8.RuneCountInString(id) > 256 {
			return
		}
		key := postgres.EventKey{XID: xid, EventID: id}
		if got, ok := httpapi.DecodeEventCursor(httpapi.EncodeEventCursor(key)); ok {
			require.Equal(t, key, got)
		}
	})
}

func FuzzJournalCursor(f *testing.F) {
	f.Add("", uint64(0), int64(1))
	f.Add(httpapi.EncodeJournalCursor(postgres.JournalKey{XID: 9, ID: 42}), uint64(9), int64(42))
	f.Fuzz(func(t *testing.T, cursor string, xid uint64, id int64) {
		if key, ok := httpapi.DecodeJournalCursor(cursor); ok {
			require.Equal(t, cursor, httpapi.EncodeJournalCursor(key))
		}
		if id < 1 {
			return
		}
		key := postgres.JournalKey{XID: xid, ID: id}
		got, ok := httpapi.DecodeJournalCursor(httpapi.EncodeJournalCursor(key))
		require.True(t, ok)
		require.Equal(t, key, got)
	})
}
