package httpapi

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/settle/settle/pkg/intake"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/postgres"
	"github.com/settle/settle/pkg/quicknode"
)

// The provider routes' side of the intake (pkg/intake): a provider's
// package verifies and decodes a delivery, its route file here hands the
// transfers to the intake and answers with what they came to.

// providerStoreTimeout bounds the storage work of one delivery, which may
// insert many events; it stays under the server's write timeout.
const providerStoreTimeout = 20 * time.Second

// Providers of deposits. Sources outside postgres name only these routes.
var (
	providerAlchemy   = intake.Provider{Name: sourceAlchemy, Source: postgres.SourceAlchemy}
	providerQuickNode = intake.Provider{Name: sourceQuickNode, Source: sourceQuickNodeEvents}
	providerMoralis   = intake.Provider{Name: sourceMoralis, Source: sourceMoralisEvents}
)

// payment_events.source of the events QuickNode and Moralis store first.
const (
	sourceQuickNodeEvents postgres.Source = "quicknode"
	sourceMoralisEvents   postgres.Source = "moralis"
)

// startIntake begins a delivery of p's in the request's trace.
func (s *Server) startIntake(c echo.Context, p intake.Provider) *intake.Run {
	return s.intake.Start(p, TraceID(c.Request().Context()))
}

// storeTransfers hands a delivery's transfers to the intake and answers
// 200 with what they came to; a storage failure is the route's error.
func storeTransfers(ctx context.Context, c echo.Context, run *intake.Run, transfers []payment.ReportedTransfer) error {
	if err := run.Store(ctx, transfers); err != nil {
		return storeError(err)
	}
	return c.JSON(http.StatusOK, run.Answer())
}

// deliveries counts every delivery to a provider route by its result:
// "accepted" for a 200, else the answer's error code.
func (s *Server) deliveries(p intake.Provider, next echo.HandlerFunc) echo.HandlerFunc {
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
		s.metrics.delivery(p.Name, result)
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
	s.intake = intake.New(intake.Options{
		Store:          s.store,
		NetworkEnabled: s.networkEnabled,
		// Each network has its own RPC, or none (RPC_URL_<NETWORK>): the
		// api's own, or one a worker reported (it is the workers' chain
		// that decides); s.chain is set after this.
		HasRPC: func(network string) bool {
			return s.chain != nil && s.chain.HasRPC(network) || s.hasReportedRPC(network)
		},
		Count: func(provider, outcome string, reason payment.IgnoreReason) {
			s.metrics.webhook(provider, outcome, string(reason))
		},
	})
	return nil
}
