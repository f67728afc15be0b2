package httpapi

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

func TestClientKey(t *testing.T) {
	for addr, want := range map[string]string{
		"198.51.100.7":         "198.51.100.7",
		"::ffff:198.51.100.7":  "198.51.100.7",
		"2001:db8:1:2:3:4:5:6": "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1": "2001:db8:1:2::/64",
		"2001:db8:1:3::1":      "2001:db8:1:3::/64",
		"fe80::1%eth0":         "fe80::/64",
		"::1":                  "::/64",
	} {
		require.Equal(t, want, clientKey(netip.MustParseAddr(addr)), addr)
	}
	require.Equal(t, "unknown", clientKey(netip.Addr{}))
}

// FuzzReadLimited: whatever the body, its declared length and how it
// arrives, a body within the limit is read whole and one over it is
// refused, and the buffer never grows past the reservation plus one byte.
func FuzzReadLimited(f *testing.F) {
	f.Add([]byte(`{"event_id":"a"}`), int64(64), int64(-1), false)
	f.Add([]byte(`{"event_id":"a"}`), int64(16), int64(16), true)
	f.Add(bytes.Repeat([]byte("x"), 70_000), int64(65_536), int64(-1), true)
	f.Add([]byte{}, int64(0), int64(0), false)
	f.Fuzz(func(t *testing.T, body []byte, limit, declared int64, oneByteReads bool) {
		if limit < 0 || limit > 1<<20 {
			return
		}
		if declared >= 0 && declared != int64(len(body)) {
			declared = -1 // net/http enforces a declared length itself
		}
		var r = bytes.NewReader(body)
		var reader = iotest.DataErrReader(r)
		if oneByteReads {
			reader = iotest.OneByteReader(r)
		}
		got, err := readLimited(reader, limit, declared)
		if int64(len(body)) > limit {
			require.True(t, errors.Is(err, errBodyTooLarge), "a body of %d bytes over %d: %v", len(body), limit, err)
			return
		}
		require.NoError(t, err)
		require.Equal(t, body, got)
		bound := limit + 1
		if declared >= 0 && declared < limit {
			bound = declared + 1
		}
		require.LessOrEqual(t, int64(cap(got)), bound)
	})
}

// readLimitedGrowing asks for every byte of buffer it takes, before it
// takes it, and stops with errUnverifiedBusy as soon as it is refused.
func TestReadLimitedGrowingReservesAsItGrows(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 100_000)
	var granted int64
	got, err := readLimitedGrowing(bytes.NewReader(data), 1<<20, -1, func(n int64) bool {
		granted += n
		return true
	})
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.Equal(t, int64(cap(got)), granted)
	require.Less(t, granted, int64(4*len(data)), "reserved far more than was read")

	granted = 0
	_, err = readLimitedGrowing(bytes.NewReader(data), 1<<20, -1, func(n int64) bool {
		if granted+n > 50_000 {
			return false
		}
		granted += n
		return true
	})
	require.ErrorIs(t, err, errUnverifiedBusy)
	require.LessOrEqual(t, granted, int64(50_000))
}
