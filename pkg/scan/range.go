package scan

// span is an inclusive block range.
type span struct{ from, to uint64 }

// bounded cuts the range next..end to at most blocksMax blocks and to the
// head: ok is false when nothing of it is at or below the head yet.
func bounded(next, end, head, blocksMax uint64) (span, bool) {
	if blocksMax == 0 || next > end || next > head {
		return span{}, false
	}
	last := min(end, head)
	if last-next >= blocksMax {
		last = next + blocksMax - 1
	}
	return span{next, last}, true
}

// chunks splits n items into runs of at most size: [start, end) pairs.
func chunks(n, size int) [][2]int {
	if size <= 0 {
		size = 1
	}
	var out [][2]int
	for start := 0; start < n; start += size {
		out = append(out, [2]int{start, min(start+size, n)})
	}
	return out
}

// lag is how many blocks at or below head the cursor has not scanned.
func lag(next, head uint64) uint64 {
	if next > head {
		return 0
	}
	return head - next + 1
}

// nextPassBlocks is the size of a network's next pass: half after one
// that ran out of time (at least one block), else twice, up to blocksMax.
func nextPassBlocks(current, blocksMax uint64, timedOut bool) uint64 {
	if timedOut {
		return max(current/2, 1)
	}
	return min(max(current, 1)*2, blocksMax)
}
