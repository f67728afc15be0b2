package devchain

import (
	"context"
	"errors"
	"fmt"

	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/ethclient"
)

// ErrRemote: sealing blocks, finalizing and reorgs need the chain itself,
// not a client of it.
var ErrRemote = errors.New("devchain: only the process that serves the chain can do this")

// Dial connects to a dev chain served by another process (`settlectl
// dev`) over HTTP JSON-RPC. The helpers that send transactions work as on
// the chain itself, signed with the dev accounts' fixed keys, and wait for
// the chain's block timer to mine them; block control does not.
func Dial(ctx context.Context, url string) (*Chain, error) {
	client, err := ethclient.DialContext(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("devchain: dial %s: %w", url, err)
	}
	accounts, _, err := devAccounts(AccountsDefault)
	if err != nil {
		client.Close()
		return nil, err
	}
	id, err := client.ChainID(ctx)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("devchain: chain id of %s: %w", url, err)
	}
	return &Chain{
		client: client, url: url, accounts: accounts,
		signer: types.LatestSignerForChainID(id),
		stop:   make(chan struct{}), remote: client, chainID: id.Int64(),
	}, nil
}
