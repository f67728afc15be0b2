package scan

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBounded(t *testing.T) {
	for _, c := range []struct {
		name                       string
		next, end, head, blocksMax uint64
		want                       span
		ok                         bool
	}{
		{"within the bound", 10, 20, 100, 500, span{10, 20}, true},
		{"cut to the bound", 10, 1000, 2000, 500, span{10, 509}, true},
		{"exactly the bound", 10, 509, 2000, 500, span{10, 509}, true},
		{"cut to the head", 10, 1000, 15, 500, span{10, 15}, true},
		{"one block", 7, 7, 7, 500, span{7, 7}, true},
		{"one block a pass", 7, 9, 9, 1, span{7, 7}, true},
		{"past the head", 16, 1000, 15, 500, span{}, false},
		{"done", 21, 20, 100, 500, span{}, false},
		{"no bound", 1, 2, 3, 0, span{}, false},
		{"block zero", 0, 0, 0, 500, span{0, 0}, true},
		{"near the top of uint64", ^uint64(0) - 1, ^uint64(0), ^uint64(0), 500, span{^uint64(0) - 1, ^uint64(0)}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := bounded(c.next, c.end, c.head, c.blocksMax)
			require.Equal(t, c.ok, ok)
			require.Equal(t, c.want, got)
		})
	}
}

func TestChunks(t *testing.T) {
	require.Nil(t, chunks(0, 1000))
	require.Equal(t, [][2]int{{0, 3}}, chunks(3, 1000))
	require.Equal(t, [][2]int{{0, 1000}, {1000, 2000}, {2000, 2001}}, chunks(2001, 1000))
	require.Len(t, chunks(100_000, 1000), 100, "100,000 addresses: 100 calls a pass")
	require.Equal(t, [][2]int{{0, 1}, {1, 2}}, chunks(2, 0), "a zero size is one item a chunk, never a loop without end")
}

func TestLag(t *testing.T) {
	require.EqualValues(t, 0, lag(11, 10))
	require.EqualValues(t, 1, lag(10, 10))
	require.EqualValues(t, 91, lag(10, 100))
}

func TestNextPassBlocks(t *testing.T) {
	require.EqualValues(t, 250, nextPassBlocks(500, 500, true))
	require.EqualValues(t, 1, nextPassBlocks(1, 500, true), "never below one block")
	require.EqualValues(t, 2, nextPassBlocks(1, 500, false))
	require.EqualValues(t, 500, nextPassBlocks(300, 500, false), "never above SCAN_BLOCKS_MAX")
	require.EqualValues(t, 500, nextPassBlocks(500, 500, false))
}
