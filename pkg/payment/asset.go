package payment

import (
	"fmt"
	"strings"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/money"
)

// Typed rejections of an incoming event; each is also ErrInvalid.
var (
	ErrUnknownUser  = fmt.Errorf("%w: unknown user", ErrInvalid)
	ErrUnknownAsset = fmt.Errorf("%w: unknown asset", ErrInvalid)
	ErrBadAmount    = fmt.Errorf("%w: invalid amount", ErrInvalid)
)

// Asset is a row of the asset registry.
type Asset struct {
	Code     string
	Network  string
	Contract string // lowercase 0x address; empty for the network's native coin
	Decimals int
}

// Native reports whether the asset is the network's own coin.
func (a Asset) Native() bool { return a.Contract == "" }

// Registry looks assets up by code and by (network, contract address).
type Registry struct {
	byCode     map[string]Asset
	byContract map[string]Asset // network + "/" + contract
	native     map[string]Asset // by network
}

// NewRegistry indexes assets.
func NewRegistry(assets []Asset) *Registry {
	r := &Registry{byCode: map[string]Asset{}, byContract: map[string]Asset{}, native: map[string]Asset{}}
	for _, a := range assets {
		r.byCode[a.Code] = a
		if a.Native() {
			r.native[a.Network] = a
		} else {
			r.byContract[a.Network+"/"+strings.ToLower(a.Contract)] = a
		}
	}
	return r
}

// ByCode finds an asset by its exact code ("eth" is not "ETH").
func (r *Registry) ByCode(code string) (Asset, bool) {
	a, ok := r.byCode[code]
	return a, ok
}

// ByContract finds a token by its contract address on a network; a symbol
// never identifies a token.
func (r *Registry) ByContract(network, contract string) (Asset, bool) {
	a, ok := r.byContract[network+"/"+strings.ToLower(contract)]
	return a, ok
}

// Native finds the network's own coin.
func (r *Registry) Native(network string) (Asset, bool) {
	a, ok := r.native[network]
	return a, ok
}

// All lists the registry.
func (r *Registry) All() []Asset {
	out := make([]Asset, 0, len(r.byCode))
	for _, a := range r.byCode {
		out = append(out, a)
	}
	return out
}

// ParseAmount validates a wire amount against the asset's precision.
func (r *Registry) ParseAmount(code, amount string) (Asset, decimal.Decimal, error) {
	asset, ok := r.ByCode(code)
	if !ok {
		return Asset{}, decimal.Decimal{}, fmt.Errorf("%w %q", ErrUnknownAsset, code)
	}
	value, err := money.Parse(amount, asset.Decimals)
	if err != nil {
		return Asset{}, decimal.Decimal{}, fmt.Errorf("%w: %w", ErrBadAmount, err)
	}
	return asset, value, nil
}
