package devchain

import (
	"context"
	"math/big"
	"sync"
	"testing"
	"time"
)

// TestConcurrentSendsWhileMining: sends from one account overlapping each
// other and the block timer each take their own nonce (a pool that has
// not yet counted the previous send must not make the next one its
// replacement).
func TestConcurrentSendsWhileMining(t *testing.T) {
	ctx := context.Background()
	c, err := Serve(ctx, Options{BlockInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				if _, err := c.SendETH(ctx, 0, "0x1111111111111111111111111111111111111111", big.NewInt(int64(1+g*100+i))); err != nil {
					t.Errorf("send %d/%d: %v", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
