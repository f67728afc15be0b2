package devchain

import (
	"errors"
	"fmt"
	"maps"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/eth"
	"github.com/ethereum/go-ethereum/eth/catalyst"
	"github.com/ethereum/go-ethereum/eth/ethconfig"
	"github.com/ethereum/go-ethereum/eth/filters"
	"github.com/ethereum/go-ethereum/eth/tracers"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/node"
	"github.com/ethereum/go-ethereum/p2p"
	"github.com/ethereum/go-ethereum/params"
	"github.com/ethereum/go-ethereum/rpc"

	// Registers callTracer, which debug_traceBlockByNumber names.
	_ "github.com/ethereum/go-ethereum/eth/tracers/native"
)

// backend is go-ethereum's simulated backend (ethclient/simulated) built
// by hand: simulated.NewBackend registers no tracers API and a started
// node refuses new APIs, so the node is assembled here the way
// simulated.newWithNode does, with debug_traceBlockByNumber added.
type backend struct {
	node   *node.Node
	beacon *catalyst.SimulatedBeacon
	client *ethclient.Client
}

// newBackend starts the node; a failed start (a port in use) is an error.
func newBackend(alloc types.GenesisAlloc, option func(*node.Config, *ethconfig.Config)) (*backend, error) {
	nodeConf := node.DefaultConfig
	nodeConf.DataDir = ""
	nodeConf.P2P = p2p.Config{NoDiscovery: true}

	// The chain starts on every fork: the system contracts those forks
	// call must be there from genesis (as simulated.NewBackend does).
	genesisAlloc := core.SystemContractAllocs()
	maps.Copy(genesisAlloc, alloc)
	ethConf := ethconfig.Defaults
	ethConf.Genesis = &core.Genesis{
		Config:   params.AllDevChainProtocolChanges,
		GasLimit: ethconfig.Defaults.Miner.GasCeil,
		Alloc:    genesisAlloc,
	}
	ethConf.SyncMode = ethconfig.FullSync
	ethConf.TxPool.NoLocals = true
	ethConf.LogNoHistory = true
	option(&nodeConf, &ethConf)

	stack, err := node.New(&nodeConf)
	if err != nil {
		return nil, fmt.Errorf("new node: %w", err)
	}
	b, err := startBackend(stack, &ethConf)
	if err != nil {
		return nil, errors.Join(err, stack.Close())
	}
	return b, nil
}

func startBackend(stack *node.Node, conf *ethconfig.Config) (*backend, error) {
	ethereum, err := eth.New(stack, conf)
	if err != nil {
		return nil, fmt.Errorf("ethereum service: %w", err)
	}
	filterSystem := filters.NewFilterSystem(ethereum.APIBackend, filters.Config{})
	apis := []rpc.API{{Namespace: "eth", Service: filters.NewFilterAPI(filterSystem)}}
	// Served only where the HTTP modules list "debug" (Options.NoTraces).
	apis = append(apis, tracers.APIs(ethereum.APIBackend)...)
	stack.RegisterAPIs(apis)
	if err := stack.Start(); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	beacon, err := catalyst.NewSimulatedBeacon(0, common.Address{}, ethereum)
	if err != nil {
		return nil, fmt.Errorf("simulated beacon: %w", err)
	}
	if err := beacon.Fork(ethereum.BlockChain().GetCanonicalHash(0)); err != nil {
		return nil, errors.Join(fmt.Errorf("simulated beacon at genesis: %w", err), beacon.Stop())
	}
	return &backend{node: stack, beacon: beacon, client: ethclient.NewClient(stack.Attach())}, nil
}

// Client is an in-process client of the node.
func (b *backend) Client() *ethclient.Client { return b.client }

// Commit seals a block.
func (b *backend) Commit() common.Hash { return b.beacon.Commit() }

// Fork makes the next blocks a side chain from parentHash; it becomes
// canonical once longer.
func (b *backend) Fork(parentHash common.Hash) error { return b.beacon.Fork(parentHash) }

// Rollback empties the pool of pending transactions.
func (b *backend) Rollback() { b.beacon.Rollback() }

// Close stops the beacon and the node.
func (b *backend) Close() error {
	b.client.Close()
	return errors.Join(b.beacon.Stop(), b.node.Close())
}
