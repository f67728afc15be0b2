package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

// POST /admin/networks and POST /admin/assets: an operator adds a chain
// or a token without a release (CONTRACT.md, "Networks"). Both are
// idempotent: the same addition again is a 200, a different one under a
// name, chain id or contract already used is a 409.

type networkJSON struct {
	Name     string `json:"name"`
	ChainID  int64  `json:"chain_id"`
	Native   string `json:"native"`
	Decimals int    `json:"decimals"`
	Status   string `json:"status"`
	TraceID  string `json:"trace_id"`
}

type listingJSON struct {
	Network  string  `json:"network"`
	Asset    string  `json:"asset"`
	Contract *string `json:"contract"` // null for the network's native coin
	Decimals int     `json:"decimals"`
	Status   string  `json:"status"`
	TraceID  string  `json:"trace_id"`
}

// Registry statuses of the answers.
const (
	registryAdded  = "added"
	registryExists = "exists"
)

func (s *Server) adminAddNetwork(c echo.Context) error {
	n, answer := readNetworkBody(c)
	if answer != nil {
		return answer
	}
	ctx, cancel := storeContext(c)
	defer cancel()
	added, err := s.store.AddNetwork(ctx, n)
	if err != nil {
		return registryError(err, n.Name)
	}
	body := networkJSON{Name: n.Name, ChainID: n.ChainID, Native: n.Native, Decimals: n.Decimals, Status: registryExists, TraceID: TraceID(c.Request().Context())}
	if !added {
		return c.JSON(http.StatusOK, body)
	}
	s.assets.invalidate()
	logging.From(c.Request().Context()).Info().Str("network", n.Name).Int64("chain_id", n.ChainID).Str("native", n.Native).Msg("network added")
	body.Status = registryAdded
	return c.JSON(http.StatusCreated, body)
}

func (s *Server) adminAddAsset(c echo.Context) error {
	a, answer := readListingBody(c)
	if answer != nil {
		return answer
	}
	ctx, cancel := storeContext(c)
	defer cancel()
	added, err := s.store.AddAsset(ctx, a)
	if err != nil {
		return registryError(err, a.Network)
	}
	body := listingJSON{Network: a.Network, Asset: a.Code, Decimals: a.Decimals, Status: registryExists, TraceID: TraceID(c.Request().Context())}
	if !a.Native() {
		body.Contract = &a.Contract
	}
	if !added {
		return c.JSON(http.StatusOK, body)
	}
	s.assets.invalidate()
	logging.From(c.Request().Context()).Info().Str("network", a.Network).Str("asset", a.Code).
		Str("contract", a.Contract).Int("decimals", a.Decimals).Msg("asset listed")
	body.Status = registryAdded
	return c.JSON(http.StatusCreated, body)
}

// registryError answers a refused addition: the store's conflict and
// unknown-network texts name only registry facts, so they are shown.
func registryError(err error, network string) error {
	switch {
	case errors.Is(err, payment.ErrConflict):
		return &apiError{status: http.StatusConflict, kind: payment.ErrConflict, message: err.Error(), cause: err}
	case errors.Is(err, payment.ErrUnknownNetwork):
		return &apiError{status: http.StatusBadRequest, kind: payment.ErrInvalid,
			message: "network " + network + " is not in the networks table (POST /admin/networks first)", cause: err}
	}
	return storeError(err)
}

// readNetworkBody reads {"name","chain_id","native","decimals"}.
func readNetworkBody(c echo.Context) (postgres.NewNetwork, *apiError) {
	fields, answer := readAdminObject(c)
	if answer != nil {
		return postgres.NewNetwork{}, answer
	}
	return parseNetworkFields(fields)
}

func parseNetworkFields(fields map[string]json.RawMessage) (postgres.NewNetwork, *apiError) {
	name, ok := jsonString(fields["name"])
	if !ok {
		return postgres.NewNetwork{}, newError(http.StatusBadRequest, "name must be a string")
	}
	chainID, ok := jsonPositiveInteger(fields["chain_id"])
	if !ok {
		return postgres.NewNetwork{}, newError(http.StatusBadRequest, "chain_id must be a JSON integer above zero")
	}
	native, ok := jsonString(fields["native"])
	if !ok {
		return postgres.NewNetwork{}, newError(http.StatusBadRequest, "native must be a string (the native coin's asset code)")
	}
	decimals, ok := jsonDecimals(fields["decimals"])
	if !ok {
		return postgres.NewNetwork{}, newError(http.StatusBadRequest, "decimals must be a JSON integer from 0 to 18")
	}
	if err := payment.CheckNetwork(name, chainID, native, decimals); err != nil {
		return postgres.NewNetwork{}, inputAnswer(err)
	}
	return postgres.NewNetwork{Name: name, ChainID: chainID, Native: native, Decimals: int(decimals)}, nil
}

// readListingBody reads {"network","asset","contract","decimals"}; a
// missing or null contract lists the network's native coin.
// "contract_address" (network_assets' column) is taken for "contract".
func readListingBody(c echo.Context) (payment.Asset, *apiError) {
	fields, answer := readAdminObject(c)
	if answer != nil {
		return payment.Asset{}, answer
	}
	return parseListingFields(fields)
}

func parseListingFields(fields map[string]json.RawMessage) (payment.Asset, *apiError) {
	network, ok := jsonString(fields["network"])
	if !ok {
		return payment.Asset{}, newError(http.StatusBadRequest, "network must be a string")
	}
	code, ok := jsonString(fields["asset"])
	if !ok {
		return payment.Asset{}, newError(http.StatusBadRequest, "asset must be a string")
	}
	// An absent contract means the native coin, so a field left unread
	// (a misspelt contract) would list a token as the network's coin.
	for k := range fields {
		switch k {
		case "network", "asset", "contract", "contract_address", "decimals":
		default:
			return payment.Asset{}, newError(http.StatusBadRequest, fmt.Sprintf(`unknown field %q; the body is {"network", "asset", "contract", "decimals"}`, truncate(k)))
		}
	}
	raw, present := fields["contract"]
	if alias, aliased := fields["contract_address"]; aliased {
		if present {
			return payment.Asset{}, newError(http.StatusBadRequest, "give contract or contract_address, not both")
		}
		raw, present = alias, true
	}
	contract := ""
	if present && !isJSONNull(raw) {
		if contract, ok = jsonString(raw); !ok || contract == "" {
			return payment.Asset{}, newError(http.StatusBadRequest, "contract must be 0x followed by 40 hex digits, or null for the native coin")
		}
	}
	decimals, ok := jsonDecimals(fields["decimals"])
	if !ok {
		return payment.Asset{}, newError(http.StatusBadRequest, "decimals must be a JSON integer from 0 to 18")
	}
	a, err := payment.CheckListing(network, code, contract, decimals)
	if err != nil {
		return payment.Asset{}, inputAnswer(err)
	}
	return a, nil
}

func readAdminObject(c echo.Context) (map[string]json.RawMessage, *apiError) {
	body, err := readBody(c, adminBodyMax)
	if err != nil {
		return nil, bodyError(err)
	}
	fields, err := decodeObject(body)
	if err != nil {
		return nil, newError(http.StatusBadRequest, "malformed JSON: "+err.Error())
	}
	return fields, nil
}

// inputAnswer shows an operator's refusal as worded for them.
func inputAnswer(err error) *apiError {
	var input *payment.InputError
	if errors.As(err, &input) {
		return newError(http.StatusBadRequest, input.Message)
	}
	return newError(http.StatusBadRequest, "")
}

// jsonDecimals reads a JSON integer literal from 0 to payment.DecimalsMax
// ("6", 6.0 and -1 are refused, as ids are).
func jsonDecimals(raw json.RawMessage) (int64, bool) {
	if string(raw) == "0" {
		return 0, true
	}
	d, ok := jsonPositiveInteger(raw)
	return d, ok && payment.ValidDecimals(d)
}
