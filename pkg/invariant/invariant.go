// Package invariant checks that the books are right: CONTRACT.md's three
// invariants, money conservation per asset, and the bookkeeping around
// them. settlectl check, the load tool, the chaos soak and the end-to-end
// tests all use it.
package invariant

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/settle/settle/pkg/postgres"
)

// Report is the outcome of one check.
type Report struct {
	Findings     []postgres.Finding
	Conservation []postgres.Conservation
}

// OK reports whether nothing is violated.
func (r Report) OK() bool {
	for _, f := range r.Findings {
		if f.Violations > 0 {
			return false
		}
	}
	for _, c := range r.Conservation {
		if !c.Holds() {
			return false
		}
	}
	return true
}

// String is the precise, human-readable report.
func (r Report) String() string {
	var b strings.Builder
	for _, f := range r.Findings {
		mark := "ok  "
		if f.Violations > 0 {
			mark = "FAIL"
		}
		fmt.Fprintf(&b, "%s %s", mark, f.Invariant)
		if f.Violations > 0 {
			fmt.Fprintf(&b, ": %d violation(s), e.g. %s", f.Violations, f.Sample)
		}
		b.WriteByte('\n')
	}
	for _, c := range r.Conservation {
		if c.Balances.IsZero() && c.Initial.IsZero() && c.Credits.IsZero() && c.Debits.IsZero() {
			continue
		}
		mark := "ok  "
		if !c.Holds() {
			mark = "FAIL"
		}
		fmt.Fprintf(&b, "%s conservation %s: balances %s = initial %s + credits %s - debits %s\n",
			mark, c.Asset, c.Balances, c.Initial, c.Credits, c.Debits)
		writeNetworkFlows(&b, c)
	}
	return b.String()
}

// Options select the checks.
type Options = postgres.InvariantOptions

// Check runs every invariant on one snapshot.
func Check(ctx context.Context, db *postgres.DB, o Options) (Report, error) {
	findings, sheet, err := db.CheckInvariants(ctx, o)
	if err != nil {
		return Report{}, err
	}
	return Report{Findings: findings, Conservation: sheet}, nil
}

// Quiet is the end-of-run check: everything terminal too.
func Quiet() Options { return Options{RequireTerminal: true, PendingKeyAfter: time.Minute} }

// JSON is the report as data: every check with its count and sample, and
// the per-asset balance sheet (with its flows per network) with amounts
// as strings.
func (r Report) JSON() map[string]any {
	checks := make([]map[string]any, 0, len(r.Findings))
	for _, f := range r.Findings {
		checks = append(checks, map[string]any{"invariant": f.Invariant, "violations": f.Violations, "sample": f.Sample})
	}
	sheet := make([]map[string]any, 0, len(r.Conservation))
	for _, c := range r.Conservation {
		sheet = append(sheet, map[string]any{
			"asset": c.Asset, "balances": c.Balances.String(), "initial": c.Initial.String(),
			"credits": c.Credits.String(), "debits": c.Debits.String(), "holds": c.Holds(),
			"networks": networkFlowsJSON(c),
		})
	}
	return map[string]any{"ok": r.OK(), "checks": checks, "conservation": sheet}
}
