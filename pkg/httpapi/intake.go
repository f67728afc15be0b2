package httpapi

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/logging"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/quicknode"
)

// The intake is the use case every provider route shares: a provider's
// package verifies and decodes a delivery into transfers; the intake
// finds their owners through deposit_addresses and stores each as the
// deposit event its transfer identity names. A fourth provider is one
// more package and one more route file.

// providerStoreTimeout bounds the storage work of one delivery, which may
// insert many events; it stays under the server's write timeout.
const providerStoreTimeout = 20 * time.Second

// Reasons a transfer is ignored by the intake (the decoders' own reasons
// come from payment and their packages).
const (
	reasonUnknownAddress    payment.IgnoreReason = "unknown_address"
	reasonNetworkDisabled   payment.IgnoreReason = "network_disabled"
	reasonConflict          payment.IgnoreReason = "conflict"
	reasonRemovedUnknown    payment.IgnoreReason = "removed_unknown"
	reasonRemovedNotDeposit payment.IgnoreReason = "removed_not_deposit"
	reasonRefused           payment.IgnoreReason = "refused_by_storage"
)

// provider names a reporter of transfers: the label of its metrics and
// logs, and the source of the events it stores first.
type provider struct {
	name   string
	source postgres.Source
}

// Providers of deposits. Sources outside postgres name only these routes.
var (
	providerAlchemy   = provider{name: sourceAlchemy, source: postgres.SourceAlchemy}
	providerQuickNode = provider{name: sourceQuickNode, source: sourceQuickNodeEvents}
	providerMoralis   = provider{name: sourceMoralis, source: sourceMoralisEvents}
)

// payment_events.source of the events QuickNode and Moralis store first.
const (
	sourceQuickNodeEvents postgres.Source = "quicknode"
	sourceMoralisEvents   postgres.Source = "moralis"
)

// providerAnswer is every provider route's 200. Accepted counts events
// newly stored by this delivery; a transfer already an event counts
// under Duplicates.
type providerAnswer struct {
	Status     string `json:"status"`
	Accepted   int    `json:"accepted"`
	Duplicates int    `json:"duplicates"`
	// Reopened counts duplicates of failed/reorged deposits sent back to
	// the ledger; Rechecked removed transfers the chain decides about
	// (with an RPC), Reversed those the flag reversed (without one).
	Reopened  int    `json:"reopened"`
	Rechecked int    `json:"rechecked"`
	Reversed  int    `json:"reversed"`
	Ignored   int    `json:"ignored"`
	TraceID   string `json:"trace_id"`
}

// intakeRun is one delivery going through the intake.
type intakeRun struct {
	s       *Server
	p       provider
	traceID string
	answer  providerAnswer
	// reported are the events whose transfer this delivery named (new or
	// not): who saw which transfer, for the console and the miss rate.
	reported []string
}

func (s *Server) newIntake(c echo.Context, p provider) *intakeRun {
	traceID := TraceID(c.Request().Context())
	return &intakeRun{s: s, p: p, traceID: traceID, answer: providerAnswer{Status: outcomeAccepted, TraceID: traceID}}
}

// ignore counts a candidate that is no deposit, with its reason.
func (in *intakeRun) ignore(reason payment.IgnoreReason) {
	in.answer.Ignored++
	in.s.metrics.webhook(in.p.name, outcomeIgnored, string(reason))
}

// store turns transfers into deposit events. Only an outage is an error
// (the provider retries, which is safe: every id comes from the transfer).
func (in *intakeRun) store(ctx context.Context, transfers []payment.ReportedTransfer) error {
	s := in.s
	log := logging.From(ctx)
	byNetwork := map[string][]string{}
	seen := map[string]bool{}
	kept := transfers[:0:0]
	for _, t := range transfers {
		if !s.networkEnabled(t.Network) {
			in.ignore(reasonNetworkDisabled)
			continue
		}
		kept = append(kept, t)
		if key := t.Network + "/" + t.ToAddress; (!t.Removed || in.storable(t)) && !seen[key] {
			seen[key] = true
			byNetwork[t.Network] = append(byNetwork[t.Network], t.ToAddress)
		}
	}
	// The recipient's owner comes only from deposit_addresses on the
	// transfer's network: a provider knows addresses, never users.
	owners := map[string]map[string]int64{}
	for network, recipients := range byNetwork {
		found, err := s.store.DepositAddressOwners(ctx, network, recipients)
		if err != nil {
			return storeError(err)
		}
		owners[network] = found
	}
	for _, t := range kept {
		if t.Removed && !in.storable(t) {
			if err := in.removed(ctx, t); err != nil {
				return err
			}
			continue
		}
		user, ok := owners[t.Network][t.ToAddress]
		if !ok {
			in.ignore(reasonUnknownAddress)
			continue
		}
		inserted, err := s.store.InsertEvent(ctx, postgres.NewEvent{
			Event: payment.Event{
				ID: t.EventID(), Type: payment.Deposit, UserID: user, Asset: t.Asset.Code,
				Amount: t.Amount, TxHash: t.TxHash, TransferIndex: t.Index, TraceID: in.traceID, Network: t.Network,
			},
			Source:    in.p.source,
			ToAddress: t.ToAddress,
		})
		switch {
		case errors.Is(err, payment.ErrConflict):
			// The same transfer reported with other content: never
			// overwrite a stored deposit; a human must look.
			in.ignore(reasonConflict)
			log.Error().Err(err).Str("provider", in.p.name).Str(logging.FieldEventID, t.EventID()).Msg("provider transfer conflicts with the stored deposit")
		case errors.Is(err, payment.ErrInvalid):
			in.ignore(reasonRefused)
			log.Error().Err(err).Str("provider", in.p.name).Str(logging.FieldEventID, t.EventID()).Msg("provider deposit refused by storage")
		case err != nil:
			return storeError(err)
		case inserted:
			in.reported = append(in.reported, t.EventID())
			in.answer.Accepted++
			s.metrics.webhook(in.p.name, outcomeAccepted, "")
			log.Info().Str("provider", in.p.name).Str(logging.FieldEventID, t.EventID()).Int64(logging.FieldUserID, user).
				Str("asset", t.Asset.Code).Msg("provider deposit")
		case t.Removed:
			// A reorged transfer settle already holds: the chain decides.
			if err := in.removed(ctx, t); err != nil {
				return err
			}
		default:
			in.reported = append(in.reported, t.EventID())
			if err := in.again(ctx, t); err != nil {
				return err
			}
		}
	}
	in.recordReports(ctx)
	return nil
}

// recordReports notes this provider's reports. A failure is logged, not
// answered: the events are stored, and the record is observability only.
func (in *intakeRun) recordReports(ctx context.Context) {
	if len(in.reported) == 0 {
		return
	}
	if err := in.s.store.RecordReports(ctx, in.p.name, in.reported); err != nil {
		logging.From(ctx).Warn().Err(err).Str("provider", in.p.name).Int("events", len(in.reported)).Msg("could not record which transfers the provider reported")
	}
}

// storable tells whether a removed transfer is stored anyway: one sent
// again on a reorg's new branch, where the chain can be asked.
func (in *intakeRun) storable(t payment.ReportedTransfer) bool {
	return t.Removed && t.Reorged && in.s.hasRPC(t.Network)
}

// removed handles a transfer a provider reports taken away by a reorg.
// Where the chain can be asked, it decides: a deposit waiting for
// finality is checked at once, one in flight is checked anyway, a
// credited one under watch is left to the reorg watcher, and a final one
// stays credited (the report is logged). Where it cannot, the report
// itself is the evidence and the deposit is reversed.
func (in *intakeRun) removed(ctx context.Context, t payment.ReportedTransfer) error {
	s := in.s
	log := logging.From(ctx)
	if !s.hasRPC(t.Network) {
		reversal, err := s.store.ReverseDeposit(ctx, t.EventID(), in.p.name+" reported the transfer as removed by a reorg", in.traceID)
		switch {
		case errors.Is(err, payment.ErrNotFound):
			in.ignore(reasonRemovedUnknown)
		case errors.Is(err, payment.ErrInvalid):
			in.ignore(reasonRemovedNotDeposit)
		case err != nil:
			return storeError(err)
		default:
			in.answer.Reversed++
			s.metrics.webhook(in.p.name, outcomeReversed, "")
			log.Warn().Str("provider", in.p.name).Str(logging.FieldEventID, t.EventID()).Str("reversal", reversal.String()).Msg("provider deposit reversed")
		}
		return nil
	}
	h, err := s.store.HurryFinalityCheck(ctx, t.EventID())
	switch {
	case errors.Is(err, payment.ErrNotFound):
		in.ignore(reasonRemovedUnknown)
		return nil
	case err != nil:
		return storeError(err)
	case !h.Type.Credit():
		in.ignore(reasonRemovedNotDeposit)
		return nil
	case h.Status == payment.StatusFailed:
		in.ignore(reasonRemovedFailed)
		return nil
	case h.Status == payment.StatusConfirmed && h.ChainState != chainStateWatching:
		// Credited and final (or credited with nothing to watch): a
		// provider's report does not outrank a finalized block.
		in.ignore(reasonRemovedFinal)
		log.Warn().Str("provider", in.p.name).Str(logging.FieldEventID, t.EventID()).Str("chain_state", h.ChainState).
			Msg("a provider reports a credited, final deposit removed; the chain says otherwise, nothing reversed")
		return nil
	}
	in.answer.Rechecked++
	s.metrics.webhook(in.p.name, outcomeRechecked, "")
	log.Info().Str("provider", in.p.name).Str(logging.FieldEventID, t.EventID()).Str("status", string(h.Status)).Bool("hurried", h.Hurried).
		Msg("a provider reports the deposit removed; the chain decides")
	return nil
}

// again handles a transfer that is already an event: one that ended
// failed/reorged is seen again, so it is reopened, and the finality gate
// credits it once the chain's policy holds (or at once without an RPC,
// where the provider's word is the evidence either way).
func (in *intakeRun) again(ctx context.Context, t payment.ReportedTransfer) error {
	s := in.s
	in.answer.Duplicates++
	s.metrics.webhook(in.p.name, outcomeDuplicate, "")
	reopened, err := s.store.ReopenDeposit(ctx, t.EventID(), []payment.Outcome{payment.OutcomeReorged}, in.p.name+" reported the transfer again")
	if err != nil {
		return storeError(err)
	}
	if reopened {
		in.answer.Reopened++
		s.metrics.webhook(in.p.name, outcomeReopened, "")
		logging.From(ctx).Warn().Str("provider", in.p.name).Str(logging.FieldEventID, t.EventID()).Msg("a provider reports a reorged deposit again; reopened")
	}
	return nil
}

// deliveries counts every delivery to a provider route by its result:
// "accepted" for a 200, else the answer's error code.
func (s *Server) deliveries(p provider, next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		err := next(c)
		result := outcomeAccepted
		var answer *apiError
		switch {
		case err == nil && c.Response().Status >= http.StatusBadRequest:
			result = kindOfStatus(c.Response().Status).code
		case errors.As(err, &answer):
			result = answer.class().code
		case err != nil:
			result = classify(err).code
		}
		s.metrics.delivery(p.name, result)
		return err
	}
}

// providerOptions takes the provider routes' settings from opts.
func (s *Server) providerOptions(opts Options, now func() time.Time) error {
	for _, secrets := range [][]string{opts.QuickNodeTokens, opts.MoralisSecrets} {
		for _, secret := range secrets {
			if secret == "" {
				return errors.New("httpapi: empty QuickNode token or Moralis secret")
			}
		}
	}
	for _, token := range opts.QuickNodeTokens {
		s.quickNodeTokens = append(s.quickNodeTokens, []byte(token))
	}
	for _, secret := range opts.MoralisSecrets {
		s.moralisSecrets = append(s.moralisSecrets, []byte(secret))
	}
	s.webhookMaxAge = opts.WebhookMaxAge
	if s.webhookMaxAge <= 0 {
		s.webhookMaxAge = quicknode.MaxAgeDefault
	}
	s.now = now
	return nil
}
