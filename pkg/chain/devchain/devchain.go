// Package devchain runs a local Ethereum chain for development and tests:
// go-ethereum's simulated backend served over real HTTP JSON-RPC (with
// debug_traceBlockByNumber and the call tracer), with blocks on a timer, a finalized tag that lags the head, prefunded
// accounts with known keys, a minimal ERC-20-like token, and real reorgs.
//
// Finality: the simulated beacon marks a block finalized only at
// multiples of 32 (an epoch): after sealing block N, the finalized block
// is N itself when N is a multiple of 32, else the previous multiple. So
// finalized lags the head by up to 31 blocks, about half a minute at the
// default one-second interval; FinalizeThrough commits blocks to push it
// past a given height at once.
package devchain

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/eth/ethconfig"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/node"
	"github.com/ethereum/go-ethereum/params"
	"github.com/ethereum/go-ethereum/rpc"
)

const (
	// ChainID is a dev chain's chain id unless Options says another:
	// ETH_MAINNET's, which settle checks its RPC against (eth_chainId).
	ChainID = 1
	// BlockIntervalDefault: one block a second keeps a demo lively while
	// finality still visibly lags (~32s).
	BlockIntervalDefault = time.Second
	// AccountsDefault prefunded accounts; AccountsMax bounds the option.
	AccountsDefault = 4
	AccountsMax     = 100
	// EpochBlocks: the simulated beacon finalizes at multiples of this.
	EpochBlocks = 32

	hostDefault = "127.0.0.1"
	// listenAttemptsMax: a free port found by the OS can be taken by
	// someone else before the node binds it; try a few.
	listenAttemptsMax = 5
	// accountBalance: a million ether each.
	accountBalanceEther = 1_000_000

	gasTransfer  = 21_000
	gasTokenCall = 100_000
	gasDeploy    = 300_000
	// tipWei: well above the dev miner's minimum tip (0.001 gwei).
	tipWei = params.GWei

	// minedWaitMax bounds how long a helper waits for its transaction to
	// be mined on the timer; minedPollInterval is how often it looks.
	minedWaitMax      = 30 * time.Second
	minedPollInterval = 20 * time.Millisecond
	// replaceAttemptsMax × replacePollInterval bounds how long Reorg waits
	// for the transaction pool to catch up with the fork.
	replaceAttemptsMax  = 250
	replacePollInterval = 20 * time.Millisecond
	// commitBlocksMax bounds one CommitBlocks or FinalizeThrough.
	commitBlocksMax = 10_000
)

// Options configure Serve. Zero values take the defaults.
type Options struct {
	// Host and Port of the HTTP JSON-RPC endpoint; Port 0 picks a free one.
	Host string
	Port int
	// BlockInterval between blocks on the timer.
	BlockInterval time.Duration
	// Manual turns the timer off: blocks are sealed only by Commit,
	// CommitBlocks, FinalizeThrough and the helpers (one block each), so
	// tests control the height exactly.
	Manual bool
	// Accounts is the number of prefunded accounts.
	Accounts int
	// ChainID is what eth_chainId answers; zero: ChainID (1). A second
	// network's dev chain takes that network's id (BASE_MAINNET: 8453).
	ChainID int64
	// NoTraces leaves the debug API (debug_traceBlockByNumber) off, as on
	// most hosted endpoints' basic plans. It is on by default: a dev
	// chain is local and throwaway, and SCAN_TRACES=on needs it.
	NoTraces bool
}

// Account is a prefunded dev account. Its key is derived from its index,
// so it is the same on every run: never use it anywhere real.
type Account struct {
	Address    string // lowercase 0x
	PrivateKey string // hex, without 0x
	key        *ecdsa.PrivateKey
}

// Tx is a mined transaction.
type Tx struct {
	Hash        string // lowercase 0x
	BlockNumber uint64
	BlockHash   string
	Status      uint64
}

// Reorg reports what Reorg did.
type Reorg struct {
	// ForkedAt is the last block the old and new branches share.
	ForkedAt uint64
	OldHead  uint64
	NewHead  uint64
	// Replacement took the dropped transaction's nonce.
	Replacement string
}

// nodeClient is what the helpers need from a node: the in-process
// simulated backend's client, or an HTTP JSON-RPC client to a dev chain
// running in another process (Dial).
type nodeClient interface {
	BlockByNumber(ctx context.Context, number *big.Int) (*types.Block, error)
	BlockNumber(ctx context.Context) (uint64, error)
	HeaderByNumber(ctx context.Context, number *big.Int) (*types.Header, error)
	PendingNonceAt(ctx context.Context, account common.Address) (uint64, error)
	SendTransaction(ctx context.Context, tx *types.Transaction) error
	TransactionByHash(ctx context.Context, hash common.Hash) (*types.Transaction, bool, error)
	TransactionReceipt(ctx context.Context, hash common.Hash) (*types.Receipt, error)
}

// Chain is a running dev chain.
type Chain struct {
	backend  *backend
	client   nodeClient
	url      string
	accounts []Account
	signer   types.Signer
	manual   bool
	chainID  int64

	// mu serialises block production, forks and sends: the simulated
	// beacon is not safe for concurrent sealing, and a fork must see an
	// empty transaction pool.
	mu        sync.Mutex
	closeOnce sync.Once
	closeErr  error
	stop      chan struct{}
	done      sync.WaitGroup
	// remote is set on a client of a chain served elsewhere (Dial).
	remote *ethclient.Client
}

// Serve starts a dev chain. It runs until Close, or until ctx ends.
func Serve(ctx context.Context, opts Options) (*Chain, error) {
	if opts.Host == "" {
		opts.Host = hostDefault
	}
	if opts.BlockInterval <= 0 {
		opts.BlockInterval = BlockIntervalDefault
	}
	if opts.Accounts <= 0 {
		opts.Accounts = AccountsDefault
	}
	if opts.Accounts > AccountsMax {
		return nil, fmt.Errorf("devchain: at most %d accounts", AccountsMax)
	}
	if opts.ChainID == 0 {
		opts.ChainID = ChainID
	}
	accounts, alloc, err := devAccounts(opts.Accounts)
	if err != nil {
		return nil, err
	}
	backend, url, err := listen(ctx, opts, alloc)
	if err != nil {
		return nil, err
	}
	c := &Chain{
		backend: backend, client: backend.Client(), url: url, accounts: accounts,
		signer: types.LatestSignerForChainID(big.NewInt(opts.ChainID)), manual: opts.Manual, chainID: opts.ChainID,
		stop: make(chan struct{}),
	}
	if !opts.Manual {
		c.done.Add(1)
		go c.produce(opts.BlockInterval)
	}
	c.done.Add(1)
	go func() {
		defer c.done.Done()
		select {
		case <-ctx.Done():
			go func() { _ = c.Close() }()
		case <-c.stop:
		}
	}()
	return c, nil
}

func listen(ctx context.Context, opts Options, alloc types.GenesisAlloc) (*backend, string, error) {
	var lastErr error
	for range listenAttemptsMax {
		if err := ctx.Err(); err != nil {
			return nil, "", err
		}
		port := opts.Port
		if port == 0 {
			free, err := freePort(opts.Host)
			if err != nil {
				return nil, "", err
			}
			port = free
		}
		backend, err := newBackend(alloc, func(nodeConf *node.Config, ethConf *ethconfig.Config) {
			genesis := *ethConf.Genesis.Config
			genesis.ChainID = big.NewInt(opts.ChainID)
			ethConf.Genesis.Config = &genesis
			ethConf.NetworkId = uint64(opts.ChainID)
			nodeConf.HTTPHost = opts.Host
			nodeConf.HTTPPort = port
			nodeConf.HTTPModules = []string{"eth", "net", "web3"}
			if !opts.NoTraces {
				nodeConf.HTTPModules = append(nodeConf.HTTPModules, "debug")
			}
			// A dev chain is reached under whatever name docker or the
			// host gives it; IP literals always pass geth's check.
			nodeConf.HTTPVirtualHosts = []string{"*"}
		})
		if err == nil {
			return backend, "http://" + net.JoinHostPort(opts.Host, strconv.Itoa(port)), nil
		}
		lastErr = err
		if opts.Port != 0 {
			break // the caller's port: nothing else to try
		}
	}
	return nil, "", fmt.Errorf("devchain: %w", lastErr)
}

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("devchain: find a free port: %w", err)
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, fmt.Errorf("devchain: listener address %s is not TCP", l.Addr())
	}
	return addr.Port, nil
}

func devAccounts(n int) ([]Account, types.GenesisAlloc, error) {
	balance := new(big.Int).Mul(big.NewInt(accountBalanceEther), big.NewInt(params.Ether))
	alloc := types.GenesisAlloc{}
	accounts := make([]Account, 0, n)
	for i := range n {
		key, err := crypto.ToECDSA(crypto.Keccak256([]byte("settle devchain account " + strconv.Itoa(i))))
		if err != nil {
			return nil, nil, fmt.Errorf("devchain: derive account %d: %w", i, err)
		}
		address := crypto.PubkeyToAddress(key.PublicKey)
		alloc[address] = types.Account{Balance: balance}
		accounts = append(accounts, Account{
			Address:    strings.ToLower(address.Hex()),
			PrivateKey: fmt.Sprintf("%x", crypto.FromECDSA(key)),
			key:        key,
		})
	}
	return accounts, alloc, nil
}

// produce seals a block every interval until Close.
func (c *Chain) produce(interval time.Duration) {
	defer c.done.Done()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-ticker.C:
			c.mu.Lock()
			c.backend.Commit()
			c.mu.Unlock()
		}
	}
}

// ChainIDOf is the chain id the chain answers.
func (c *Chain) ChainIDOf() int64 { return c.chainID }

// URL is the HTTP JSON-RPC endpoint.
func (c *Chain) URL() string { return c.url }

// Accounts are the prefunded accounts.
func (c *Chain) Accounts() []Account { return append([]Account(nil), c.accounts...) }

// Close stops block production and the node. Calling it again is a no-op.
func (c *Chain) Close() error {
	if c.remote != nil {
		c.remote.Close()
		return nil
	}
	c.closeOnce.Do(func() {
		close(c.stop)
		c.done.Wait()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.closeErr = c.backend.Close()
	})
	return c.closeErr
}

// Commit seals one block and returns its number.
func (c *Chain) Commit(ctx context.Context) (uint64, error) {
	if c.remote != nil {
		return 0, ErrRemote
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backend.Commit()
	return c.client.BlockNumber(ctx)
}

// CommitBlocks seals n blocks.
func (c *Chain) CommitBlocks(ctx context.Context, n int) error {
	if c.remote != nil {
		return ErrRemote
	}
	if n < 0 || n > commitBlocksMax {
		return fmt.Errorf("devchain: commit between 0 and %d blocks, not %d", commitBlocksMax, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		c.backend.Commit()
	}
	return nil
}

// Head is the latest block's number.
func (c *Chain) Head(ctx context.Context) (uint64, error) {
	return c.client.BlockNumber(ctx)
}

// Finalized is the finalized block's number.
func (c *Chain) Finalized(ctx context.Context) (uint64, error) {
	h, err := c.client.HeaderByNumber(ctx, big.NewInt(int64(rpc.FinalizedBlockNumber)))
	if err != nil {
		return 0, fmt.Errorf("devchain: finalized header: %w", err)
	}
	return h.Number.Uint64(), nil
}

// FinalizeThrough seals blocks until block number is finalized: up to the
// next multiple of EpochBlocks.
func (c *Chain) FinalizeThrough(ctx context.Context, number uint64) error {
	if c.remote != nil {
		return ErrRemote
	}
	target := (number + EpochBlocks - 1) / EpochBlocks * EpochBlocks
	c.mu.Lock()
	defer c.mu.Unlock()
	for range commitBlocksMax {
		head, err := c.client.BlockNumber(ctx)
		if err != nil {
			return fmt.Errorf("devchain: head: %w", err)
		}
		if head >= target {
			break
		}
		c.backend.Commit()
	}
	finalized, err := c.Finalized(ctx)
	if err != nil {
		return err
	}
	if finalized < number {
		return fmt.Errorf("devchain: finalized block is %d after sealing to the epoch boundary %d, want at least %d", finalized, target, number)
	}
	return nil
}

// SendETH transfers wei from account index from and waits until mined.
func (c *Chain) SendETH(ctx context.Context, from int, to string, wei *big.Int) (Tx, error) {
	recipient, err := address(to)
	if err != nil {
		return Tx{}, err
	}
	if wei == nil || wei.Sign() < 0 {
		return Tx{}, errors.New("devchain: amount must be zero or more wei")
	}
	return c.send(ctx, from, &recipient, wei, gasTransfer, nil)
}

// DeployToken deploys the dev token from account index from and returns
// its lowercase address.
func (c *Chain) DeployToken(ctx context.Context, from int) (string, Tx, error) {
	return c.deploy(ctx, from, gasDeploy, tokenInitcode(), "token")
}

// deploy sends initcode from account index from and answers the new
// contract's lowercase address.
func (c *Chain) deploy(ctx context.Context, from int, gas uint64, initcode []byte, what string) (string, Tx, error) {
	tx, err := c.send(ctx, from, nil, new(big.Int), gas, initcode)
	if err != nil {
		return "", Tx{}, err
	}
	if tx.Status != types.ReceiptStatusSuccessful {
		return "", Tx{}, fmt.Errorf("devchain: %s deployment reverted", what)
	}
	receipt, err := c.client.TransactionReceipt(ctx, common.HexToHash(tx.Hash))
	if err != nil {
		return "", Tx{}, fmt.Errorf("devchain: deploy receipt: %w", err)
	}
	return strings.ToLower(receipt.ContractAddress.Hex()), tx, nil
}

// TransferToken calls token.transfer(to, value) from account index from:
// a receipt with one Transfer(from, to, value) log.
func (c *Chain) TransferToken(ctx context.Context, from int, token, to string, value *big.Int) (Tx, error) {
	contract, err := address(token)
	if err != nil {
		return Tx{}, err
	}
	recipient, err := address(to)
	if err != nil {
		return Tx{}, err
	}
	if value == nil || value.Sign() < 0 || value.BitLen() > 256 {
		return Tx{}, errors.New("devchain: token value must fit an unsigned 256-bit word")
	}
	return c.send(ctx, from, &contract, new(big.Int), gasTokenCall, transferCalldata(recipient, value))
}

// ForkAt forks the chain after block parent, as a reorg deeper than any
// confirmations would: the blocks above it (none finalized) and their
// transactions are gone, and nothing is mined yet. Transactions queued
// next (QueueETH, QueueTokenTransfer) go into the new branch as
// CommitBlocks mines it. It answers the old head.
func (c *Chain) ForkAt(ctx context.Context, parent uint64) (uint64, error) {
	if c.remote != nil {
		return 0, ErrRemote
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backend.Commit() // a fork needs an empty pool
	finalized, err := c.Finalized(ctx)
	if err != nil {
		return 0, err
	}
	if parent < finalized {
		return 0, fmt.Errorf("devchain: block %d is finalized (finalized: %d); finalized blocks are never reorged", parent+1, finalized)
	}
	oldHead, err := c.client.BlockNumber(ctx)
	if err != nil {
		return 0, fmt.Errorf("devchain: head: %w", err)
	}
	header, err := c.client.HeaderByNumber(ctx, new(big.Int).SetUint64(parent))
	if err != nil {
		return 0, fmt.Errorf("devchain: header %d: %w", parent, err)
	}
	if err := c.backend.Fork(header.Hash()); err != nil {
		return 0, fmt.Errorf("devchain: fork at %d: %w", parent, err)
	}
	c.backend.Rollback()
	return oldHead, nil
}

// QueueETH sends wei to the pool without mining it (see
// QueueTokenTransfer); it answers the transaction's hash.
func (c *Chain) QueueETH(ctx context.Context, from int, to string, wei *big.Int) (string, error) {
	recipient, err := address(to)
	if err != nil {
		return "", err
	}
	if wei == nil || wei.Sign() < 0 {
		return "", errors.New("devchain: amount must be zero or more wei")
	}
	acct, err := c.account(from)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	hash, err := c.submit(ctx, acct, &recipient, wei, gasTransfer, nil)
	return strings.ToLower(hash.Hex()), err
}

// QueueTokenTransfer sends a token transfer to the pool without mining
// it: on a manual chain, the next transaction sent (or Resend) is mined
// in the same block, after it. It answers the transaction's hash.
func (c *Chain) QueueTokenTransfer(ctx context.Context, from int, token, to string, value *big.Int) (string, error) {
	contract, err := address(token)
	if err != nil {
		return "", err
	}
	recipient, err := address(to)
	if err != nil {
		return "", err
	}
	acct, err := c.account(from)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	hash, err := c.submit(ctx, acct, &contract, new(big.Int), gasTokenCall, transferCalldata(recipient, value))
	return strings.ToLower(hash.Hex()), err
}

// SendReverting calls the token with calldata it refuses: a mined
// transaction whose receipt has status 0.
func (c *Chain) SendReverting(ctx context.Context, from int, token string) (Tx, error) {
	contract, err := address(token)
	if err != nil {
		return Tx{}, err
	}
	return c.send(ctx, from, &contract, new(big.Int), gasTokenCall, revertingCalldata)
}

func (c *Chain) account(index int) (Account, error) {
	if index < 0 || index >= len(c.accounts) {
		return Account{}, fmt.Errorf("devchain: no account %d (there are %d)", index, len(c.accounts))
	}
	return c.accounts[index], nil
}

// send signs and submits a transaction, then seals a block (manual mode)
// or waits for the timer to mine it.
func (c *Chain) send(ctx context.Context, from int, to *common.Address, value *big.Int, gas uint64, data []byte) (Tx, error) {
	acct, err := c.account(from)
	if err != nil {
		return Tx{}, err
	}
	c.mu.Lock()
	hash, err := c.submit(ctx, acct, to, value, gas, data)
	if err == nil && c.manual {
		c.backend.Commit()
	}
	c.mu.Unlock()
	if err != nil {
		return Tx{}, err
	}
	return c.waitMined(ctx, hash)
}

// submit signs and sends with the account's next nonce. The caller holds
// mu, so two sends cannot take the same nonce. The pool counts a send in
// its pending nonce only once it has processed it, and after a block
// reorganizes itself in the background: a nonce read too early is one a
// pending transaction already has, refused as its replacement. Read
// again once the pool caught up (seconds on a loaded machine).
func (c *Chain) submit(ctx context.Context, acct Account, to *common.Address, value *big.Int, gas uint64, data []byte) (common.Hash, error) {
	sender := common.HexToAddress(acct.Address)
	deadline := time.Now().Add(nonceRetryFor)
	for {
		nonce, err := c.client.PendingNonceAt(ctx, sender)
		if err != nil {
			return common.Hash{}, fmt.Errorf("devchain: nonce: %w", err)
		}
		tip, feeCap, err := c.currentFees(ctx)
		if err != nil {
			return common.Hash{}, err
		}
		tx, err := types.SignNewTx(acct.key, c.signer, &types.DynamicFeeTx{
			ChainID: big.NewInt(c.chainID), Nonce: nonce, To: to, Value: value, Gas: gas,
			GasTipCap: tip, GasFeeCap: feeCap, Data: data,
		})
		if err != nil {
			return common.Hash{}, fmt.Errorf("devchain: sign: %w", err)
		}
		err = c.client.SendTransaction(ctx, tx)
		if err == nil {
			return tx.Hash(), nil
		}
		if !nonceTaken(err) || time.Now().After(deadline) {
			return common.Hash{}, fmt.Errorf("devchain: send: %w", err)
		}
		select {
		case <-ctx.Done():
			return common.Hash{}, fmt.Errorf("devchain: send: %w (%w)", err, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// nonceRetryFor bounds how long submit waits for the pool's pending
// nonce to count the transactions it already holds.
const nonceRetryFor = 30 * time.Second

// nonceTaken: the pool refused the transaction because its nonce is one
// a transaction it holds (or mined) already has.
func nonceTaken(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "replacement transaction underpriced") || strings.Contains(msg, "nonce too low")
}

// currentFees: the standard tip, and a fee cap of twice the base fee plus
// the tip, which survives a few blocks of base fee growth.
func (c *Chain) currentFees(ctx context.Context) (tip, feeCap *big.Int, err error) {
	head, err := c.client.HeaderByNumber(ctx, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("devchain: head: %w", err)
	}
	tip = big.NewInt(tipWei)
	baseFee := head.BaseFee
	if baseFee == nil {
		baseFee = new(big.Int)
	}
	return tip, new(big.Int).Add(new(big.Int).Mul(baseFee, big.NewInt(2)), tip), nil
}

func (c *Chain) waitMined(ctx context.Context, hash common.Hash) (Tx, error) {
	ctx, cancel := context.WithTimeout(ctx, minedWaitMax)
	defer cancel()
	ticker := time.NewTicker(minedPollInterval)
	defer ticker.Stop()
	for {
		receipt, err := c.client.TransactionReceipt(ctx, hash)
		if err == nil {
			return Tx{
				Hash:        strings.ToLower(hash.Hex()),
				BlockNumber: receipt.BlockNumber.Uint64(),
				BlockHash:   strings.ToLower(receipt.BlockHash.Hex()),
				Status:      receipt.Status,
			}, nil
		}
		// A fresh chain answers "transaction indexing is in progress" for
		// a moment after start: not mined yet, as far as we can tell.
		if !errors.Is(err, ethereum.NotFound) && !strings.Contains(err.Error(), "indexing is in progress") {
			return Tx{}, fmt.Errorf("devchain: receipt of %s: %w", hash.Hex(), err)
		}
		select {
		case <-ctx.Done():
			return Tx{}, fmt.Errorf("devchain: %s not mined: %w", hash.Hex(), ctx.Err())
		case <-ticker.C:
		}
	}
}

// Reorg drops a mined transaction from the canonical chain the way a real
// reorg does: the chain forks at the parent of the transaction's block, a
// replacement from the same sender takes its nonce (so it can never be
// mined again), and the new branch grows one block longer than the old
// one. Other transactions of the dropped blocks return to the pool and
// are mined again on the new branch. Finalized blocks cannot be reorged;
// the sender must be a dev account.
func (c *Chain) Reorg(ctx context.Context, txHash string) (Reorg, error) {
	if c.remote != nil {
		return Reorg{}, ErrRemote
	}
	hash := common.HexToHash(txHash)
	c.mu.Lock()
	defer c.mu.Unlock()
	block, tx, err := c.forkable(ctx, hash)
	if err != nil {
		return Reorg{}, err
	}
	sender, err := types.Sender(c.signer, tx)
	if err != nil {
		return Reorg{}, fmt.Errorf("devchain: sender of %s: %w", txHash, err)
	}
	var acct *Account
	for i := range c.accounts {
		if c.accounts[i].Address == strings.ToLower(sender.Hex()) {
			acct = &c.accounts[i]
		}
	}
	if acct == nil {
		return Reorg{}, fmt.Errorf("devchain: sender %s is not a dev account", sender.Hex())
	}
	oldHead, err := c.client.BlockNumber(ctx)
	if err != nil {
		return Reorg{}, fmt.Errorf("devchain: head: %w", err)
	}
	parent, err := c.client.HeaderByNumber(ctx, new(big.Int).SetUint64(block-1))
	if err != nil {
		return Reorg{}, fmt.Errorf("devchain: parent header: %w", err)
	}
	if err := c.backend.Fork(parent.Hash()); err != nil {
		return Reorg{}, fmt.Errorf("devchain: fork at %d: %w", block-1, err)
	}
	replacement, err := c.replace(ctx, *acct, tx)
	if err != nil {
		return Reorg{}, err
	}
	for range oldHead - (block - 1) + 1 {
		c.backend.Commit()
	}
	newHead, err := c.client.BlockNumber(ctx)
	if err != nil {
		return Reorg{}, fmt.Errorf("devchain: head: %w", err)
	}
	if _, err := c.client.TransactionReceipt(ctx, hash); !errors.Is(err, ethereum.NotFound) {
		return Reorg{}, fmt.Errorf("devchain: %s survived the reorg (receipt error: %v)", txHash, err) //nolint:errorlint // err may be nil here: printed, not wrapped
	}
	return Reorg{ForkedAt: block - 1, OldHead: oldHead, NewHead: newHead, Replacement: strings.ToLower(replacement.Hex())}, nil
}

// Drop takes a mined transaction off the canonical chain the way a reorg
// that does not re-include it (yet) does: the chain forks at the parent
// of its block, the other transactions of the dropped blocks are mined
// again on the new branch, and the new branch grows one block longer than
// the old one. No replacement takes its nonce, so Resend can mine the
// very same transaction again later; until then its sender's later
// transactions wait behind it. Finalized blocks cannot be dropped.
func (c *Chain) Drop(ctx context.Context, txHash string) (Reorg, *types.Transaction, error) {
	if c.remote != nil {
		return Reorg{}, nil, ErrRemote
	}
	hash := common.HexToHash(txHash)
	c.mu.Lock()
	defer c.mu.Unlock()
	block, tx, err := c.forkable(ctx, hash)
	if err != nil {
		return Reorg{}, nil, err
	}
	oldHead, err := c.client.BlockNumber(ctx)
	if err != nil {
		return Reorg{}, nil, fmt.Errorf("devchain: head: %w", err)
	}
	// The other transactions of the blocks the fork drops, to mine again.
	var others []*types.Transaction
	for n := block; n <= oldHead; n++ {
		b, err := c.client.BlockByNumber(ctx, new(big.Int).SetUint64(n))
		if err != nil {
			return Reorg{}, nil, fmt.Errorf("devchain: block %d: %w", n, err)
		}
		for _, t := range b.Transactions() {
			if t.Hash() != hash {
				others = append(others, t)
			}
		}
	}
	parent, err := c.client.HeaderByNumber(ctx, new(big.Int).SetUint64(block-1))
	if err != nil {
		return Reorg{}, nil, fmt.Errorf("devchain: parent header: %w", err)
	}
	if err := c.backend.Fork(parent.Hash()); err != nil {
		return Reorg{}, nil, fmt.Errorf("devchain: fork at %d: %w", block-1, err)
	}
	c.backend.Rollback()
	for _, t := range others {
		// A transaction already known to the pool, or one whose nonce
		// now waits behind the dropped one, is fine as it is.
		_ = c.client.SendTransaction(ctx, t)
	}
	for range oldHead - (block - 1) + 1 {
		c.backend.Commit()
	}
	newHead, err := c.client.BlockNumber(ctx)
	if err != nil {
		return Reorg{}, nil, fmt.Errorf("devchain: head: %w", err)
	}
	if _, err := c.client.TransactionReceipt(ctx, hash); !errors.Is(err, ethereum.NotFound) {
		return Reorg{}, nil, fmt.Errorf("devchain: %s survived the drop (receipt error: %v)", txHash, err) //nolint:errorlint // err may be nil here: printed, not wrapped
	}
	return Reorg{ForkedAt: block - 1, OldHead: oldHead, NewHead: newHead}, tx, nil
}

// Resend submits a transaction Drop took off the chain again and waits
// until it is mined: the same hash, in a new block.
func (c *Chain) Resend(ctx context.Context, tx *types.Transaction) (Tx, error) {
	if c.remote != nil {
		return Tx{}, ErrRemote
	}
	c.mu.Lock()
	err := c.client.SendTransaction(ctx, tx)
	if err == nil && c.manual {
		c.backend.Commit()
	}
	c.mu.Unlock()
	if err != nil {
		return Tx{}, fmt.Errorf("devchain: resend %s: %w", tx.Hash().Hex(), err)
	}
	return c.waitMined(ctx, tx.Hash())
}

// forkable seals what is pending (a fork needs an empty pool) and finds
// the mined transaction hash and its block, which must not be finalized.
// The caller holds mu.
func (c *Chain) forkable(ctx context.Context, hash common.Hash) (uint64, *types.Transaction, error) {
	c.backend.Commit()
	receipt, err := c.client.TransactionReceipt(ctx, hash)
	if err != nil {
		return 0, nil, fmt.Errorf("devchain: receipt of %s: %w", hash.Hex(), err)
	}
	block := receipt.BlockNumber.Uint64()
	finalized, err := c.Finalized(ctx)
	if err != nil {
		return 0, nil, err
	}
	if block <= finalized {
		return 0, nil, fmt.Errorf("devchain: block %d is finalized (finalized: %d); finalized blocks are never reorged", block, finalized)
	}
	tx, _, err := c.client.TransactionByHash(ctx, hash)
	if err != nil {
		return 0, nil, fmt.Errorf("devchain: transaction %s: %w", hash.Hex(), err)
	}
	return block, tx, nil
}

// replace sends a zero-value self-transfer with tx's nonce and higher
// fees. Right after a fork the pool may still hold the old branch's
// state and refuse the nonce as too low, so it retries, boundedly.
func (c *Chain) replace(ctx context.Context, acct Account, tx *types.Transaction) (common.Hash, error) {
	self := common.HexToAddress(acct.Address)
	bump := func(v *big.Int) *big.Int {
		return new(big.Int).Add(new(big.Int).Mul(v, big.NewInt(2)), big.NewInt(tipWei))
	}
	signed, err := types.SignNewTx(acct.key, c.signer, &types.DynamicFeeTx{
		ChainID: big.NewInt(c.chainID), Nonce: tx.Nonce(), To: &self, Value: new(big.Int), Gas: gasTransfer,
		GasTipCap: bump(tx.GasTipCap()), GasFeeCap: bump(tx.GasFeeCap()),
	})
	if err != nil {
		return common.Hash{}, fmt.Errorf("devchain: sign replacement: %w", err)
	}
	var lastErr error
	for range replaceAttemptsMax {
		if lastErr = c.client.SendTransaction(ctx, signed); lastErr == nil {
			return signed.Hash(), nil
		}
		select {
		case <-ctx.Done():
			return common.Hash{}, ctx.Err()
		case <-time.After(replacePollInterval):
		}
	}
	return common.Hash{}, fmt.Errorf("devchain: replacement not accepted: %w", lastErr)
}

func address(s string) (common.Address, error) {
	if !common.IsHexAddress(s) {
		return common.Address{}, fmt.Errorf("devchain: %q is not an address", s)
	}
	return common.HexToAddress(s), nil
}
