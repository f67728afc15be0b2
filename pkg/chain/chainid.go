package chain

import (
	"context"
	"fmt"

	"github.com/ethereum/go-ethereum/common/hexutil"
)

const methodChainID = "eth_chainId"

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
