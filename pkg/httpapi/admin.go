package httpapi

import (
	"bytes"
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
)

type userJSON struct {
	UserID  int64  `json:"user_id"`
	Status  string `json:"status"`
	TraceID string `json:"trace_id"`
}

// adminPutUser registers a user; PUT because doing it twice is harmless.
func (s *Server) adminPutUser(c echo.Context) error {
	user, ok := positiveIntegerParam(c.Param("id"))
	if !ok {
		return newError(http.StatusBadRequest, "user id must be an integer above zero")
	}
	body, err := readBody(c, adminBodyMax)
	if err != nil {
		return bodyError(err)
	}
	// The body is empty or {}: a user has no attributes yet, and anything
	// else is probably a caller expecting fields we would ignore.
	if len(bytes.TrimSpace(body)) > 0 {
		fields, err := decodeObject(body)
		if err != nil || len(fields) > 0 {
			return newError(http.StatusBadRequest, "body must be empty or {}")
		}
	}
	ctx, cancel := storeContext(c)
	defer cancel()
	created, err := s.store.CreateUser(ctx, user)
	if err != nil {
		return storeError(err)
	}
	traceID := TraceID(c.Request().Context())
	if !created {
		return c.JSON(http.StatusOK, userJSON{UserID: user, Status: "exists", TraceID: traceID})
	}
	logging.From(c.Request().Context()).Info().Int64(logging.FieldUserID, user).Msg("user created")
	return c.JSON(http.StatusCreated, userJSON{UserID: user, Status: "created", TraceID: traceID})
}

type depositAddressJSON struct {
	Address string `json:"address"`
	Network string `json:"network"`
	UserID  int64  `json:"user_id"`
	Status  string `json:"status"`
	TraceID string `json:"trace_id"`
	// Backfill is the job scanning the address from from_block, if given.
	Backfill string `json:"backfill,omitempty"`
}

// adminAddDepositAddress maps a chain address to its user; it is the only
// way an Alchemy transfer finds a user.
func (s *Server) adminAddDepositAddress(c echo.Context) error {
	body, err := readBody(c, adminBodyMax)
	if err != nil {
		return bodyError(err)
	}
	fields, err := decodeObject(body)
	if err != nil {
		return newError(http.StatusBadRequest, "malformed JSON: "+err.Error())
	}
	address, ok := jsonString(fields["address"])
	if !ok {
		return newError(http.StatusBadRequest, "address must be a string")
	}
	if address, ok = alchemy.NormalizeAddress(address); !ok {
		return newError(http.StatusBadRequest, "address must be 0x followed by 40 hex digits")
	}
	network, ok := jsonString(fields["network"])
	if !ok || !alchemy.ValidNetwork(network) {
		return newError(http.StatusBadRequest, "network must be a name like ETH_MAINNET")
	}
	user, ok := jsonPositiveInteger(fields["user_id"])
	if !ok {
		return newError(http.StatusBadRequest, "user_id must be a JSON integer above zero")
	}
	from, backfill, err := backfillFrom(fields)
	if err != nil {
		return err
	}

	ctx, cancel := storeContext(c)
	defer cancel()
	registry, err := s.assets.get(ctx)
	if err != nil {
		return storeError(err)
	}
	// An address on a network settle has no asset for could never be
	// credited; refusing it catches typos like ETH_MAINET.
	if !knowsNetwork(registry, network) {
		if registry, err = s.assets.refreshForMiss(ctx); err != nil {
			return storeError(err)
		}
		if !knowsNetwork(registry, network) {
			return newError(http.StatusBadRequest, "network "+network+" is not in the networks table (settlectl networks add)")
		}
	}
	inserted, err := s.store.AddDepositAddress(ctx, network, address, user)
	var backfillID string
	if err == nil && backfill {
		if backfillID, err = s.backfill(ctx, network, address, from); err != nil {
			return err
		}
	}
	traceID := TraceID(c.Request().Context())
	switch {
	case errors.Is(err, payment.ErrConflict):
		return &apiError{status: http.StatusConflict, message: "address is registered to another user", cause: err}
	case err != nil:
		return storeError(err)
	case !inserted:
		return c.JSON(http.StatusOK, depositAddressJSON{Address: address, Network: network, UserID: user, Status: "exists", TraceID: traceID, Backfill: backfillID})
	}
	logging.From(c.Request().Context()).Info().Int64(logging.FieldUserID, user).
		Str("network", network).Str("address", address).Msg("deposit address registered")
	return c.JSON(http.StatusCreated, depositAddressJSON{Address: address, Network: network, UserID: user, Status: "registered", TraceID: traceID, Backfill: backfillID})
}

func knowsNetwork(registry *payment.Registry, network string) bool {
	_, ok := registry.Network(network)
	return ok
}
