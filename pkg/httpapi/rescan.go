package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/alchemy"
	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
)

const (
	// RescanBlocksMaxDefault bounds one rescan (RESCAN_BLOCKS_MAX): at 500
	// blocks a pass, 200 passes.
	RescanBlocksMaxDefault = 100_000
	// blockNumberMax keeps a block number well inside bigint.
	blockNumberMax = 1 << 62
	// blockDigitsMax: 2^62 has 19 digits.
	blockDigitsMax = 19
	// rescanIDLengthMax bounds a job id in the path.
	rescanIDLengthMax = 64
	// cancelReasonLengthMax bounds why a job was cancelled, as a dead
	// letter's reason is bounded.
	cancelReasonLengthMax = payment.ReasonLengthMax
)

// RescanStore is what the rescan routes need; *postgres.DB implements it.
type RescanStore interface {
	CreateRescan(ctx context.Context, id, network string, from, to uint64, operator string) (postgres.RescanJob, error)
	Rescan(ctx context.Context, id string) (postgres.RescanJob, error)
	AddBackfill(ctx context.Context, id, network, address string, from uint64) error
	CancelRescan(ctx context.Context, id, who, why string) error
}

var _ RescanStore = (*postgres.DB)(nil)

type rescanJSON struct {
	ID          string  `json:"id"`
	Network     string  `json:"network"`
	Address     string  `json:"address,omitempty"`
	FromBlock   uint64  `json:"from_block"`
	ToBlock     *uint64 `json:"to_block"`
	NextBlock   uint64  `json:"next_block"`
	BlocksDone  uint64  `json:"blocks_done"`
	BlocksTotal *uint64 `json:"blocks_total"`
	Status      string  `json:"status"`
	Error       string  `json:"error,omitempty"`
	// WaitingHead: present while the job waits for the chain, the
	// network's finality head the scanner last read, below next_block.
	WaitingHead *uint64 `json:"waiting_head,omitempty"`
	Found       int     `json:"found"`
	// Restarts: how often the branch changed under the job between its
	// passes and it read blocks again; the latest's time and reason are
	// present once there was one.
	Restarts          int        `json:"restarts"`
	LastRestartAt     *time.Time `json:"last_restart_at,omitempty"`
	LastRestartReason string     `json:"last_restart_reason,omitempty"`
	RequestedBy       string     `json:"requested_by"`
	Operator          string     `json:"operator,omitempty"`
	CreatedAt         time.Time  `json:"created_at"`
	UpdatedAt         time.Time  `json:"updated_at"`
	TraceID           string     `json:"trace_id"`
}

func rescanView(j postgres.RescanJob, traceID string) rescanJSON {
	v := rescanJSON{ID: j.ID, Network: j.Network, Address: j.Address, FromBlock: j.FromBlock, ToBlock: j.ToBlock,
		NextBlock: j.NextBlock, Status: j.Status, Error: j.Error, WaitingHead: j.WaitingHead, Found: j.Found, RequestedBy: j.RequestedBy, Operator: j.Operator,
		Restarts: j.Restarts, LastRestartAt: j.LastRestartAt, LastRestartReason: j.LastRestartReason,
		CreatedAt: j.CreatedAt, UpdatedAt: j.UpdatedAt, TraceID: traceID}
	if j.NextBlock > j.FromBlock {
		v.BlocksDone = j.NextBlock - j.FromBlock
	}
	if j.ToBlock != nil && *j.ToBlock+1 >= j.FromBlock {
		total := *j.ToBlock + 1 - j.FromBlock
		v.BlocksTotal = &total
	}
	return v
}

// rescanRequest is a validated POST /admin/rescan body.
type rescanRequest struct {
	network  string
	from, to uint64
	// operator is who asks and why: the body's "operator" (as a recheck's)
	// or operatorDefault, then " @" and the client's address.
	operator string
}

// parseRescan validates a rescan body: a network name, two block numbers
// (JSON integers from 0), from ≤ to, at most blocksMax blocks, and an
// optional "operator" (a name, and why, as a recheck's).
func parseRescan(body []byte, blocksMax uint64) (rescanRequest, error) {
	fields, err := decodeObject(body)
	if err != nil {
		return rescanRequest{}, fmt.Errorf("malformed JSON: %w", err)
	}
	for k := range fields {
		if k != "network" && k != "from_block" && k != "to_block" && k != "operator" {
			return rescanRequest{}, fmt.Errorf("unknown field %q", truncate(k))
		}
	}
	var r rescanRequest
	var ok bool
	r.operator = operatorDefault
	if raw, given := fields["operator"]; given {
		name, ok := jsonString(raw)
		name = strings.TrimSpace(name)
		if !ok || !printable(name) || utf8.RuneCountInString(name) > operatorLengthMax {
			return rescanRequest{}, fmt.Errorf("operator must be a printable string of at most %d characters", operatorLengthMax)
		}
		if name != "" {
			r.operator = name
		}
	}
	if r.network, ok = jsonString(fields["network"]); !ok || !alchemy.ValidNetwork(r.network) {
		return rescanRequest{}, errors.New("network must be a name like ETH_MAINNET")
	}
	if r.from, ok = jsonBlock(fields["from_block"]); !ok {
		return rescanRequest{}, errors.New("from_block must be a JSON integer from 0")
	}
	if r.to, ok = jsonBlock(fields["to_block"]); !ok {
		return rescanRequest{}, errors.New("to_block must be a JSON integer from 0")
	}
	return r, rescanRange(r.from, r.to, blocksMax)
}

// rescanRange checks a block range: from ≤ to, at most blocksMax blocks.
func rescanRange(from, to, blocksMax uint64) error {
	if to < from {
		return errors.New("to_block is below from_block")
	}
	if to-from >= blocksMax {
		return fmt.Errorf("a rescan covers at most %d blocks (RESCAN_BLOCKS_MAX); split the range", blocksMax)
	}
	return nil
}

// jsonBlock reads a block number: a JSON integer literal from 0 ("7",
// -1, 1e3 and 7.0 are refused).
func jsonBlock(raw json.RawMessage) (uint64, bool) {
	if len(raw) == 0 || len(raw) > blockDigitsMax || (len(raw) > 1 && raw[0] == '0') {
		return 0, false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(string(raw), 10, 64)
	return n, err == nil && n <= blockNumberMax
}

func (s *Server) rescanStore() (RescanStore, error) {
	rs, ok := s.store.(RescanStore)
	if !ok {
		return nil, newError(http.StatusNotFound, "rescans are not served by this store")
	}
	return rs, nil
}

// adminRescan schedules a rescan of a block range for every registered
// address of a network; the scheduler runs it in bounded passes.
func (s *Server) adminRescan(c echo.Context) error {
	body, err := readBody(c, adminBodyMax)
	if err != nil {
		return bodyError(err)
	}
	r, err := parseRescan(body, uint64(s.rescanBlocksMax()))
	if err != nil {
		return newError(http.StatusBadRequest, err.Error())
	}
	r.operator += " @" + ClientIP(c.Request().Context()).String()
	ctx, cancel := storeContext(c)
	defer cancel()
	job, err := s.createRescan(ctx, r)
	if err != nil {
		return err
	}
	traceID := TraceID(c.Request().Context())
	logging.From(c.Request().Context()).Info().Str("rescan", job.ID).Str("network", r.network).
		Uint64("from_block", r.from).Uint64("to_block", r.to).Str("requested_by", r.operator).Msg("rescan scheduled")
	return c.JSON(http.StatusAccepted, rescanView(job, traceID))
}

// createRescan records a validated rescan of an enabled network.
func (s *Server) createRescan(ctx context.Context, r rescanRequest) (postgres.RescanJob, error) {
	rs, err := s.rescanStore()
	if err != nil {
		return postgres.RescanJob{}, err
	}
	registry, err := s.assets.get(ctx)
	if err != nil {
		return postgres.RescanJob{}, storeError(err)
	}
	if !knowsNetwork(registry, r.network) || !s.networkEnabled(r.network) {
		return postgres.RescanJob{}, newError(http.StatusBadRequest, "network "+r.network+" is not an enabled network (NETWORKS)")
	}
	job, err := rs.CreateRescan(ctx, "rescan_"+uuid.NewString(), r.network, r.from, r.to, r.operator)
	if err != nil {
		return postgres.RescanJob{}, storeError(err)
	}
	return job, nil
}

// StartRescan is POST /admin/rescan's operation for the console's form:
// the same range rules (RESCAN_BLOCKS_MAX) and network check, recorded as
// asked for by operator; a refusal is payment.ErrInvalid.
func (s *Server) StartRescan(ctx context.Context, network string, from, to uint64, operator string) (string, error) {
	if err := rescanRange(from, to, uint64(s.rescanBlocksMax())); err != nil {
		return "", payment.Invalid("%v", err)
	}
	job, err := s.createRescan(ctx, rescanRequest{network: network, from: from, to: to, operator: operator})
	var answer *apiError
	if errors.As(err, &answer) && answer.status == http.StatusBadRequest {
		return "", payment.Invalid("%s", answer.message)
	}
	if err != nil {
		return "", err
	}
	logging.From(ctx).Info().Str("rescan", job.ID).Str("network", network).
		Uint64("from_block", from).Uint64("to_block", to).Msg("rescan scheduled")
	return job.ID, nil
}

// adminRescanGet shows a rescan's (or backfill's) progress.
func (s *Server) adminRescanGet(c echo.Context) error {
	id := c.Param("id")
	if id == "" || len(id) > rescanIDLengthMax || !printable(id) {
		return newError(http.StatusBadRequest, "rescan id is malformed")
	}
	rs, err := s.rescanStore()
	if err != nil {
		return err
	}
	ctx, cancel := storeContext(c)
	defer cancel()
	job, err := rs.Rescan(ctx, id)
	if err != nil {
		return storeError(err)
	}
	return c.JSON(http.StatusOK, rescanView(job, TraceID(c.Request().Context())))
}

// adminRescanCancel ends a running rescan or backfill for an operator
// who names themselves and says why (settlectl rescan cancel's
// operation): 404 for an unknown job, 409 for one that already ended.
func (s *Server) adminRescanCancel(c echo.Context) error {
	id := c.Param("id")
	if id == "" || len(id) > rescanIDLengthMax || !printable(id) {
		return newError(http.StatusBadRequest, "rescan id is malformed")
	}
	body, err := readBody(c, adminBodyMax)
	if err != nil {
		return bodyError(err)
	}
	name, why, err := parseRescanCancel(body)
	if err != nil {
		return newError(http.StatusBadRequest, err.Error())
	}
	rs, err := s.rescanStore()
	if err != nil {
		return err
	}
	who := name + " @" + ClientIP(c.Request().Context()).String()
	ctx, cancel := storeContext(c)
	defer cancel()
	if err := rs.CancelRescan(ctx, id, who, why); err != nil {
		if errors.Is(err, postgres.ErrRescanEnded) {
			return fail(payment.ErrConflict, "rescan "+id+" already ended; only a running job can be cancelled")
		}
		return storeError(err)
	}
	logging.From(c.Request().Context()).Info().Str("rescan", id).Str("cancelled_by", who).Str("reason", why).Msg("rescan cancelled")
	job, err := rs.Rescan(ctx, id)
	if err != nil {
		return storeError(err)
	}
	return c.JSON(http.StatusOK, rescanView(job, TraceID(c.Request().Context())))
}

// parseRescanCancel reads {"operator": "<name>", "reason": "<why>"}: the
// reason required, both printable and bounded, since a cancel ends a job
// for good and the job's error is all that tells who ended it and why;
// no operator named is operatorDefault, as for the other admin actions.
func parseRescanCancel(body []byte) (operator, reason string, err error) {
	fields, err := decodeObject(body)
	if err != nil {
		return "", "", fmt.Errorf("malformed JSON: %w", err)
	}
	for k := range fields {
		if k != "operator" && k != "reason" {
			return "", "", fmt.Errorf(`unknown field %q; the body is {"operator": "<name>", "reason": "<why>"}`, truncate(k))
		}
	}
	operator = operatorDefault
	if raw, given := fields["operator"]; given {
		name, ok := jsonString(raw)
		name = strings.TrimSpace(name)
		if !ok || !printable(name) || utf8.RuneCountInString(name) > operatorLengthMax {
			return "", "", fmt.Errorf("operator must be a printable string of at most %d characters", operatorLengthMax)
		}
		if name != "" {
			operator = name
		}
	}
	reason, ok := jsonString(fields["reason"])
	reason = strings.TrimSpace(reason)
	if !ok || reason == "" || !printable(reason) || utf8.RuneCountInString(reason) > cancelReasonLengthMax {
		return "", "", fmt.Errorf("reason is required: a printable string of at most %d characters", cancelReasonLengthMax)
	}
	return operator, reason, nil
}

// backfillFrom reads the optional from_block of a deposit address
// registration; present false when there is none.
func backfillFrom(fields map[string]json.RawMessage) (from uint64, present bool, err error) {
	raw, ok := fields["from_block"]
	if !ok || isJSONNull(raw) {
		return 0, false, nil
	}
	if from, ok = jsonBlock(raw); !ok {
		return 0, false, newError(http.StatusBadRequest, "from_block must be a JSON integer from 0")
	}
	return from, true, nil
}

// backfill schedules the scan of a newly registered address from block
// from up to where the cursor sees it; it answers the job id.
func (s *Server) backfill(ctx context.Context, network, address string, from uint64) (string, error) {
	rs, err := s.rescanStore()
	if err != nil {
		return "", err
	}
	id := "backfill_" + uuid.NewString()
	if err := rs.AddBackfill(ctx, id, network, address, from); err != nil {
		return "", storeError(err)
	}
	return id, nil
}

func (s *Server) rescanBlocksMax() int64 {
	if s.rescanMax > 0 {
		return s.rescanMax
	}
	return RescanBlocksMaxDefault
}
