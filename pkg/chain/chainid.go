package chain

import (
	"context"
	"errors"
	"fmt"

	"github.com/ethereum/go-ethereum/common/hexutil"
)

const methodChainID = "eth_chainId"

// ErrWrongChain: an RPC endpoint serves another chain than its network's.
var ErrWrongChain = errors.New("rpc endpoint serves another chain")

// ChainID asks the node which chain it serves (eth_chainId), through the
// breaker like every call.
func (c *Client) ChainID(ctx context.Context) (int64, error) {
	var id hexutil.Big
	err := c.call(ctx, methodChainID, func(ctx context.Context) error {
		return c.rpc.CallContext(ctx, &id, methodChainID)
	})
	if err != nil {
		return 0, err
	}
	v := id.ToInt()
	if v.Sign() <= 0 || !v.IsInt64() {
		return 0, fmt.Errorf("eth_chainId answered %s, not a chain id", v)
	}
	return v.Int64(), nil
}

// checkChain asks eth_chainId once it matches ClientOptions.ChainID; till
// then every call asks first (one at a time: the others wait for its
// answer). A failed ask is an outage; another chain is ErrWrongChain.
func (c *Client) checkChain(ctx context.Context) error {
	c.chainMu.Lock()
	defer c.chainMu.Unlock()
	if c.chainChecked.Load() {
		return nil
	}
	id, err := c.ChainID(ctx)
	if err != nil {
		return fmt.Errorf("chain id not checked yet: %w", err)
	}
	if id != c.chainID {
		return fmt.Errorf("%w: eth_chainId answers %d, not %d", ErrWrongChain, id, c.chainID)
	}
	c.chainChecked.Store(true)
	return nil
}
