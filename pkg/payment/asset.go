package payment

import (
	"fmt"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/money"
)

// Typed rejections of an incoming event; each is also ErrInvalid.
var (
	ErrUnknownUser    = fmt.Errorf("%w: unknown user", ErrInvalid)
	ErrUnknownAsset   = fmt.Errorf("%w: unknown asset", ErrInvalid)
	ErrBadAmount      = fmt.Errorf("%w: invalid amount", ErrInvalid)
	ErrUnknownNetwork = fmt.Errorf("%w: unknown network", ErrInvalid)
)

// DefaultNetwork is the network of an event that names none.
const DefaultNetwork = "ETH_MAINNET"

// Network is a row of networks: a chain settle settles on.
type Network struct {
	Name string
	// ChainID is what the network's RPC must answer to eth_chainId; zero
	// when settle does not know it (a network carried over from round one).
	ChainID int64
	// Native is the ledger code of the network's own coin; empty if none.
	Native string
}

// Asset is a listing of a ledger code on one network (a row of
// network_assets): the same code may have other contracts and other
// decimals elsewhere, and is one balance everywhere.
type Asset struct {
	Code     string
	Network  string
	Contract string // lowercase 0x address; empty for the network's native coin
	Decimals int
}

// Native reports whether the asset is the network's own coin.
func (a Asset) Native() bool { return a.Contract == "" }

// Registry looks networks and listings up. It is safe for concurrent use,
// and Replace swaps in a fresh reading of the tables at once, so running
// processes see an operator's additions without a restart.
type Registry struct {
	snap atomic.Pointer[registrySnapshot]
}

type registrySnapshot struct {
	networks   map[string]Network
	byChainID  map[int64]Network
	codes      map[string]bool
	listings   map[string]Asset // network + "/" + code
	byContract map[string]Asset // network + "/" + contract
	native     map[string]Asset // by network
	tokens     map[string][]Asset
}

// NewRegistry indexes networks and listings. A listing's network need not
// be among networks (tests list assets alone); it is then known by name.
func NewRegistry(assets []Asset, networks ...Network) *Registry {
	r := &Registry{}
	r.snap.Store(index(assets, networks))
	return r
}

func index(assets []Asset, networks []Network) *registrySnapshot {
	s := &registrySnapshot{
		networks: map[string]Network{}, byChainID: map[int64]Network{}, codes: map[string]bool{},
		listings: map[string]Asset{}, byContract: map[string]Asset{}, native: map[string]Asset{}, tokens: map[string][]Asset{},
	}
	for _, n := range networks {
		s.networks[n.Name] = n
		if n.ChainID != 0 {
			s.byChainID[n.ChainID] = n
		}
	}
	for _, a := range assets {
		a.Contract = strings.ToLower(a.Contract)
		s.codes[a.Code] = true
		s.listings[a.Network+"/"+a.Code] = a
		if _, ok := s.networks[a.Network]; !ok {
			s.networks[a.Network] = Network{Name: a.Network}
		}
		if a.Native() {
			s.native[a.Network] = a
		} else {
			s.byContract[a.Network+"/"+a.Contract] = a
			s.tokens[a.Network] = append(s.tokens[a.Network], a)
		}
	}
	for _, list := range s.tokens {
		sort.Slice(list, func(i, j int) bool { return list[i].Contract < list[j].Contract })
	}
	return s
}

// Replace makes other's contents this registry's.
func (r *Registry) Replace(other *Registry) { r.snap.Store(other.snap.Load()) }

func (r *Registry) s() *registrySnapshot { return r.snap.Load() }

// Known reports whether code is a ledger asset code on some network
// ("eth" is not "ETH").
func (r *Registry) Known(code string) bool { return r.s().codes[code] }

// Listing finds code on network.
func (r *Registry) Listing(network, code string) (Asset, bool) {
	a, ok := r.s().listings[network+"/"+code]
	return a, ok
}

// ByContract finds a token by its contract address on a network; a symbol
// never identifies a token.
func (r *Registry) ByContract(network, contract string) (Asset, bool) {
	a, ok := r.s().byContract[network+"/"+strings.ToLower(contract)]
	return a, ok
}

// Native finds the network's own coin.
func (r *Registry) Native(network string) (Asset, bool) {
	a, ok := r.s().native[network]
	return a, ok
}

// Tokens lists a network's listed contracts, ordered by address.
func (r *Registry) Tokens(network string) []Asset {
	return append([]Asset(nil), r.s().tokens[network]...)
}

// Network finds a network by name.
func (r *Registry) Network(name string) (Network, bool) {
	n, ok := r.s().networks[name]
	return n, ok
}

// NetworkByChainID finds the network whose chain id is id.
func (r *Registry) NetworkByChainID(id int64) (Network, bool) {
	n, ok := r.s().byChainID[id]
	return n, ok
}

// Networks lists the networks by name.
func (r *Registry) Networks() []Network {
	s := r.s()
	out := make([]Network, 0, len(s.networks))
	for _, n := range s.networks {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// All lists every listing, by network then code.
func (r *Registry) All() []Asset {
	s := r.s()
	out := make([]Asset, 0, len(s.listings))
	for _, a := range s.listings {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Network != out[j].Network {
			return out[i].Network < out[j].Network
		}
		return out[i].Code < out[j].Code
	})
	return out
}

// Precision is the most decimals code has on any network: what the ledger
// must be able to hold of it.
func (r *Registry) Precision(code string) (int, bool) {
	best, ok := 0, false
	for _, a := range r.s().listings {
		if a.Code == code {
			best, ok = max(best, a.Decimals), true
		}
	}
	return best, ok
}

// ParseAmount validates a wire amount of code on network against that
// network's decimals for it.
func (r *Registry) ParseAmount(network, code, amount string) (Asset, decimal.Decimal, error) {
	asset, ok := r.Listing(network, code)
	if !ok {
		if !r.Known(code) {
			return Asset{}, decimal.Decimal{}, fmt.Errorf("%w %q", ErrUnknownAsset, code)
		}
		return Asset{}, decimal.Decimal{}, fmt.Errorf("%w %q on %s", ErrUnknownAsset, code, network)
	}
	value, err := money.Parse(amount, asset.Decimals)
	if err != nil {
		return Asset{}, decimal.Decimal{}, fmt.Errorf("%w: %w", ErrBadAmount, err)
	}
	return asset, value, nil
}
