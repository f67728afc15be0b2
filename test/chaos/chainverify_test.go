package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/payment"
	"github.com/settle/settle/pkg/testenv"
)

// balanceSampleInterval spaces the run-time checks that no balance is
// negative (the schema's CHECK is not what is being tested).
const balanceSampleInterval = time.Second

// balanceWatch samples negative balances while the soak runs.
type balanceWatch struct {
	mu       sync.Mutex
	samples  []string
	found    int
	checks   int
	failures int
	// invariant 4's samples (holdsverify_test.go)
	heldSamples           []string
	heldFound, heldChecks int
}

// watchBalances samples until ctx ends; errors (PostgreSQL down on
// purpose) only skip a sample.
func watchBalances(ctx context.Context, pool *pgxpool.Pool) *balanceWatch {
	w := &balanceWatch{}
	go func() {
		ticker := time.NewTicker(balanceSampleInterval)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			w.sample(ctx, pool)
		}
	}()
	return w
}

func (w *balanceWatch) sample(ctx context.Context, pool *pgxpool.Pool) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	defer w.sampleHeld(ctx, pool) // after this sample's lock and rows are released
	rows, err := pool.Query(ctx, `SELECT user_id, asset, balance::text FROM balances WHERE balance < 0 LIMIT 5`)
	if err != nil {
		w.mu.Lock()
		w.failures++
		w.mu.Unlock()
		return
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var user int64
		var asset, balance string
		if rows.Scan(&user, &asset, &balance) == nil {
			found = append(found, fmt.Sprintf("user %d %s at %s: %s", user, asset, time.Now().Format("15:04:05.000"), balance))
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if rows.Err() != nil {
		w.failures++
		return
	}
	w.checks++
	w.found += len(found)
	for _, f := range found {
		if len(w.samples) < findingSamples {
			w.samples = append(w.samples, f)
		}
	}
}

func (w *balanceWatch) report(v *verdict) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.samples {
		v.fail("NEGATIVE BALANCE", "%s", s)
	}
	if w.found > len(w.samples) {
		v.count["NEGATIVE BALANCE"] += w.found - len(w.samples)
	}
	v.note("balances sampled %d times during the run (%d samples skipped: database unreachable)", w.checks, w.failures)
	w.reportHeld(v)
}

func isChainUser(user int64) bool {
	return user > chainUserBase && user <= chainUserBase+chainUserCount
}

// verifyChain holds the books of the chain's users against the soak's
// own model: what it put on the chain (each transfer's recipient, asset,
// exact amount, transaction and log), what the chain shows now, and what
// each provider delivery was answered. payment_events is read only to
// find the rows that name a transaction, never for what to expect.
func verifyChain(ctx context.Context, v *verdict, pool *pgxpool.Pool, l *chainLoad, rig *chainRig, windows []window) {
	stored, err := loadEvents(ctx, pool)
	if err != nil {
		v.fail("books unreadable", "%v", err)
		return
	}
	l.mu.Lock()
	transfers := append([]*transfer(nil), l.transfers...)
	anomalies, anomalous, undelivered := append([]string(nil), l.anomalies...), l.anomalous, append([]string(nil), l.undeliv...)
	forks := append([]devchain.Reorg(nil), l.forks...)
	l.mu.Unlock()
	for _, a := range anomalies {
		v.fail("chain: provider answers the contract forbids", "%s", a)
	}
	if anomalous > len(anomalies) {
		v.count["chain: provider answers the contract forbids"] += anomalous - len(anomalies)
	}
	for _, u := range undelivered {
		v.fail("chain: reports never answered", "no definitive answer within %s: %s", deliveryMax, u)
	}

	byTx := map[string][]*storedEvent{}
	outcomes := map[string]int{}
	// What a deposit's compensations and give-backs moved, by deposit id,
	// and how many compensations applied.
	reorgMoved := map[string]decimal.Decimal{}
	compensations := map[string]int{}
	net := func(e *storedEvent) decimal.Decimal { return e.journalSum.Add(reorgMoved[e.ID]) }
	for _, e := range stored {
		if !isChainUser(e.User) {
			continue
		}
		outcomes[e.Type+" "+e.status+"/"+e.outcome]++
		if origin := reorgOrigin(e.ID); origin != "" {
			// A compensation, or the credit giving one back: it moves
			// its deposit's money, counted with it (net below).
			if e.journalRows > 0 {
				reorgMoved[origin] = reorgMoved[origin].Add(e.journalSum)
				if e.Type == "reorg_compensation" {
					compensations[origin]++
				}
			}
			continue
		}
		if e.txHash == "" {
			v.fail("chain: event of a chain user without a transaction", "%s %+v", e.ID, e.spec)
			continue
		}
		byTx[strings.ToLower(e.txHash)] = append(byTx[strings.ToLower(e.txHash)], e)
	}
	claims, err := loadChainTransfers(ctx, pool)
	if err != nil {
		v.fail("books unreadable", "chain_transfers: %v", err)
	}

	expected := map[balanceKey]decimal.Decimal{}
	modelTx := map[string]bool{}
	crediting := map[string]*transfer{}
	compensated := map[string]bool{} // credits of dropped transfers, compensated as they must be
	twins, twinCredits := 0, 0
	credited, doubled, lost, reorged := 0, 0, 0, 0
	remined, staleIndex := 0, 0
	scannerOnly, scannerOnlyCredited, belowCursor := 0, 0, 0
	// A transaction carries one transfer, or two identical ones (the
	// doubler's): reports that name no index may claim either.
	groups := map[string][]*transfer{}
	var order []string
	for _, tr := range transfers {
		if groups[tr.hash] == nil {
			order = append(order, tr.hash)
		}
		groups[tr.hash] = append(groups[tr.hash], tr)
	}
	for _, hash := range order {
		group := groups[hash]
		tr := group[0] // the transfers of a group differ only in their index
		modelTx[hash] = true
		// A fork re-mines the other transactions of the blocks it drops;
		// a token transfer re-mined in another block has another log
		// index there (log indexes count per block). The transfer is what
		// it moved, so its index is read again from the node.
		canonical, err := rig.relocate(ctx, group)
		if err != nil {
			v.fail("chain unreadable", "%s: %v", hash, err)
		}
		moved := false
		for _, t := range group {
			if t.index != t.minedIndex {
				moved = true
				remined++
			}
		}
		if !canonical {
			reorged += len(group)
		}
		truthful, unindexed := false, false
		indexed := map[string]bool{} // indices a truthful, acknowledged report named
		payments := map[string]*report{}
		for _, t := range group {
			for _, rep := range t.reports {
				truthful = truthful || rep.originalHeld
				if rep.originalHeld && (rep.source == "alchemy" || rep.withIndex) {
					indexed[t.index] = true
				}
				unindexed = unindexed || (rep.originalHeld && rep.source == "payments" && !rep.withIndex)
				if rep.source == "payments" {
					payments[rep.id] = rep
				}
			}
		}
		// Every id the api acknowledged is stored, with the version the
		// answers say it holds.
		for id, rep := range payments {
			if !rep.originalHeld && !rep.conflictHeld {
				continue
			}
			e, ok := stored[id]
			if !ok {
				v.fail("chain: LOST (acknowledged, not stored)", "%s (transfer %s)", id, hash)
				continue
			}
			want := tr.amount
			if rep.conflictHeld {
				want = tr.amount.Add(decimal.New(1, -unitExponent(tr.asset)))
			}
			if !decimal.RequireFromString(e.Amount).Equal(want) || e.User != tr.user || e.Asset != tr.asset || !strings.EqualFold(e.txHash, hash) {
				v.fail("chain: stored content differs from what was sent", "%s stored as %+v tx %s, sent %s %s to user %d in %s", id, e.spec, e.txHash, want, tr.asset, tr.user, hash)
			}
		}

		events := byTx[hash]
		var credits []*storedEvent
		unexplained := 0
		for _, e := range events {
			if _, ok := payments[e.ID]; !ok {
				unexplained++ // a provider-derived event (Alchemy's), one per transfer at most
			}
			if e.journalRows > 0 || e.status == "confirmed" {
				if canonical && net(e).IsZero() && compensations[e.ID] > 0 {
					// Compensated and never given back: no credit (the
					// compensation check below says so).
					continue
				}
				credits = append(credits, e)
				continue
			}
			truthfulContent := e.User == tr.user && e.Asset == tr.asset && decimal.RequireFromString(e.Amount).Equal(tr.amount)
			switch {
			case e.status != "failed":
				v.fail("chain: NOT SETTLED", "%s is still %s (transfer %s)", e.ID, e.status, hash)
			case !canonical && e.outcome != "reorged" && e.outcome != "not_found" && e.outcome != "duplicate_transfer" && (truthfulContent || e.outcome != "mismatch"):
				v.fail("chain: a report of a transfer a fork dropped failed for the wrong reason", "%s ended failed/%s (transfer %s)", e.ID, e.outcome, hash)
				v.trace(e.ID, hash)
			case canonical && truthfulContent && e.outcome == "mismatch" && moved &&
				(strings.HasPrefix(e.ID, payment.TransferEventIDPrefix) || (payments[e.ID] != nil && payments[e.ID].withIndex)):
				// A report naming the log index the transfer had before a
				// fork re-mined it elsewhere: the transaction's paying logs
				// are offered whatever index it names (seed
				// 4701253035119547 lost a credit when they were not).
				staleIndex++
				v.fail("chain: a true report naming a shifted log index ended mismatch", "%s (transfer %s, now at %s)", e.ID, hash, indices(group))
				v.trace(e.ID, hash)
			case canonical && truthfulContent && e.outcome != "duplicate_transfer":
				v.fail("chain: a true report of a canonical transfer failed other than as a duplicate", "%s ended failed/%s (transfer %s)", e.ID, e.outcome, hash)
			case canonical && !truthfulContent && e.outcome != "mismatch" && e.outcome != "duplicate_transfer":
				v.fail("chain: a false report failed for the wrong reason", "%s (%s %s, the chain says %s) ended failed/%s", e.ID, e.Amount, e.Asset, tr.amount, e.outcome)
			}
		}
		explained := len(group)
		if l.faults != nil {
			// The scanner (or a rescan) also found a re-mined transfer at
			// its new index: one event per index it had.
			for _, t := range group {
				if t.index != t.minedIndex {
					explained++
				}
			}
		}
		if unexplained > explained {
			v.fail("chain: events no report explains", "transaction %s (%d transfers) is named by %d events that are no acknowledged payments id (one Alchemy or scanner event per transfer and index at most)", hash, len(group), unexplained)
		}
		// How many credits the transaction must have: each transfer at
		// most once; at least one if a truthful report was acknowledged,
		// and at least every transfer a truthful report named by index.
		most := 0
		if truthful && canonical {
			most = len(group)
		}
		least := min(most, max(1, len(indexed)))
		if moved {
			// Every report naming an index may have ended reorged while
			// the fork had the transaction out, under an id the new
			// block's reports no longer use; a report naming none still
			// resolves to where it is now.
			least = 0
			if unindexed {
				least = min(most, 1)
			}
		}
		unreported := false
		if l.faults != nil && canonical {
			// Provider-fault mode: the scanner finds every final transfer,
			// reported or not, so each is credited exactly once.
			most, least = len(group), len(group)
			if beyondPolicy(forks, group) {
				belowCursor += len(group)
			}
			unreported = l.faults.unreported(group)
		}
		switch {
		case !canonical && len(credits) > len(group):
			doubled++
			v.fail("chain: DOUBLE CREDIT (one transfer credited more than once)", "%s %s to user %d in %s (dropped by a fork; %d transfers): credited by %s", tr.amount, tr.asset, tr.user, hash, len(group), describe(credits))
		case !canonical:
			// Credited before the fork: it must be compensated, once.
			for _, e := range credits {
				if compensations[e.ID] == 0 || !net(e).IsZero() {
					comp := stored[payment.CompensationEventID(e.ID)]
					v.fail("chain: REORGED TRANSFER STILL CREDITED", "%s credited %s %s to user %d; its transaction %s left the chain, %d compensations, net %s, first compensation: %s",
						e.ID, tr.amount, tr.asset, tr.user, hash, compensations[e.ID], net(e), describeOne(comp))
					v.trace(e.ID, hash)
				}
				compensated[e.ID] = true
			}
		case len(credits) > most && most >= 1:
			doubled++
			v.fail("chain: DOUBLE CREDIT (one transfer credited more than once)", "%s %s to user %d in %s (%d transfers): credited by %s", tr.amount, tr.asset, tr.user, hash, len(group), describe(credits))
		case len(credits) > most:
			v.fail("chain: CREDIT WITHOUT A TRUTHFUL, ACKNOWLEDGED REPORT", "%s: credited by %s", hash, describe(credits))
		case l.faults != nil && len(credits) < least:
			lost++
			v.fail("chain: LOST (final transfer never credited)", "transfer %s %s to user %d in %s (%d transfers, %d credited) never credited; %s; events: %s",
				tr.amount, tr.asset, tr.user, hash, len(group), len(credits), l.faults.fate(group), describe(events))
			v.trace(hash)
		case len(credits) < least:
			lost++
			v.fail("chain: LOST (canonical transfer, acknowledged report, never credited)", "%s %s to user %d in %s (%d transfers, %d named by index; events: %s)", tr.amount, tr.asset, tr.user, hash, len(group), len(indexed), describe(events))
		}
		for _, e := range credits {
			if e.journalRows != 1 || !e.journalSum.Equal(tr.amount) || e.User != tr.user || e.Asset != tr.asset || e.status != "confirmed" {
				v.fail("chain: credit differs from the transfer", "%s: %s with %d journal rows summing %s for user %d %s; the chain moved %s %s to user %d",
					e.ID, e.status, e.journalRows, e.journalSum, e.User, e.Asset, tr.amount, tr.asset, tr.user)
			}
		}
		if unreported {
			scannerOnly += len(group)
			scannerOnlyCredited += len(credits)
		}
		if most == 0 {
			continue
		}
		n := min(max(len(credits), least), most)
		credited += n
		k := balanceKey{tr.user, tr.asset}
		expected[k] = expected[k].Add(tr.amount.Mul(decimal.NewFromInt(int64(n))))
		claimedBy := map[string]string{} // event id → the index its chain_transfers row names
		for _, t := range group {
			if c, ok := claims[claimKey{chainNetwork, hash, t.index}]; ok {
				claimedBy[c.eventID] = t.index
			}
		}
		if moved {
			// Mined again elsewhere, its logs have other indexes there, and
			// the claims follow them.
			for k, c := range claims {
				if k.network == chainNetwork && k.txHash == hash {
					claimedBy[c.eventID] = k.index
				}
			}
		}
		for _, e := range credits {
			crediting[e.ID] = tr
			if _, ok := claimedBy[e.ID]; !ok && claims != nil {
				v.fail("chain: credited transfer without its chain_transfers row", "%s credits %s %s in %s, and no chain_transfers row of that transaction's transfers (%s) names it",
					e.ID, e.Amount, e.Asset, hash, indices(group))
			}
		}
		if len(group) > 1 {
			twins++
			twinCredits += len(credits)
		}
	}
	for hash, events := range byTx {
		if !modelTx[hash] {
			v.fail("chain: events naming a transaction the soak never made", "%s: %s", hash, describe(events))
		}
	}
	for key := range claims {
		if !modelTx[key.txHash] {
			v.fail("chain: chain_transfers row for a transaction the soak never made", "%+v", key)
		}
	}
	// Compensations only for credits of transfers a fork dropped: a lie
	// of the RPC proxy is never evidence.
	for _, e := range stored {
		if isChainUser(e.User) && e.Type == "reorg_compensation" && e.journalRows > 0 {
			origin := reorgOrigin(e.ID)
			switch tr, ok := crediting[origin]; {
			case ok && stored[origin] != nil && net(stored[origin]).Equal(tr.amount):
				// Compensated, then given back when the transfer was
				// final on the chain again.
			case ok:
				v.fail("chain: COMPENSATED A CANONICAL TRANSFER (a lie of the RPC taken as a reorg)", "%s debited %s %s of user %d; %s is canonical", e.ID, e.journalSum.Neg(), e.Asset, e.User, tr.hash)
			case !compensated[origin]:
				v.fail("chain: compensation of no credit of a dropped transfer", "%s: %s %s", e.ID, e.journalSum, e.Asset)
			}
		}
		if isChainUser(e.User) && strings.HasPrefix(e.ID, payment.ReturnEventIDPrefix) && e.journalRows > 0 && compensations[reorgOrigin(e.ID)] == 0 {
			v.fail("chain: give-back of no compensated credit", "%s: %s %s", e.ID, e.journalSum, e.Asset)
		}
	}
	// Dead letters of the chain's events: only a fault that kept the
	// workers from PostgreSQL or the node can explain one.
	for _, e := range stored {
		if !isChainUser(e.User) {
			continue
		}
		for _, d := range e.dlq {
			if _, ok := explainChain(d, windows, e.created); !ok {
				v.fail("chain: UNEXPLAINED DEAD LETTERS", "row %d for %s (at %s, event now %s/%s): %s", d.id, d.eventID, d.created.Format("15:04:05.000"), e.status, e.outcome, d.reason)
			}
		}
	}

	balances, err := loadBalances(ctx, pool)
	if err != nil {
		v.fail("books unreadable", "balances: %v", err)
		return
	}
	for _, user := range rig.users {
		for _, asset := range []string{"ETH", chainToken} {
			k := balanceKey{user, asset}
			if got, want := balances[k], expected[k]; !got.Equal(want) {
				v.fail("chain: BALANCE WRONG", "user %d %s is %s; the chain and the reports say %s (off by %s)", user, asset, got, want, got.Sub(want))
			}
		}
	}
	for k, got := range balances {
		if isChainUser(k.user) && k.asset != "ETH" && k.asset != chainToken && !got.IsZero() {
			v.fail("chain: BALANCE WRONG", "user %d %s is %s; no transfer touched it", k.user, k.asset, got)
		}
	}
	checkInvariant5(ctx, v, pool)
	v.note("chain: %d transfers (%d credited, %d doubled, %d lost, %d not canonical; %d transactions with two identical logs, credited %d times); events of the chain's users: %v",
		len(transfers), credited, doubled, lost, reorged, twins, twinCredits, outcomes)
	v.note("chain: %d token transfers re-mined at another log index by a fork; %d reports naming the old index ended mismatch", remined, staleIndex)
	givenBack := 0
	for _, e := range stored {
		if isChainUser(e.User) && strings.HasPrefix(e.ID, payment.ReturnEventIDPrefix) && e.journalRows > 0 {
			givenBack++
		}
	}
	v.note("chain: %d compensations applied, %d given back (a dropped transaction mined again)", sumCounts(compensations), givenBack)
	v.note("chain: rpc proxy %s", rig.rpc.Stats())
	if l.faults != nil {
		verifyProviders(ctx, v, pool, l, l.faults.scans, scannerOnly, scannerOnlyCredited, belowCursor)
	}
}

func indices(group []*transfer) string {
	var out []string
	for _, t := range group {
		out = append(out, t.index)
	}
	return strings.Join(out, ", ")
}

func unitExponent(asset string) int32 {
	if asset == chainToken {
		return chainTokenDecimals
	}
	return ethDecimals
}

func describeOne(e *storedEvent) string {
	if e == nil {
		return "none"
	}
	return fmt.Sprintf("%s %s/%s, %d journal rows summing %s", e.ID, e.status, e.outcome, e.journalRows, e.journalSum)
}

func describe(events []*storedEvent) string {
	if len(events) == 0 {
		return "none"
	}
	var parts []string
	for _, e := range events {
		parts = append(parts, fmt.Sprintf("%s %s %s/%s (%d journal rows)", e.ID, e.Amount, e.status, e.outcome, e.journalRows))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// relocate asks the node itself, not through the proxy, whether every
// transfer of a transaction's group is on the canonical chain, and sets
// each token transfer's index to where its log is now: the group's
// transfers (identical but for their index) take the matching logs in
// order.
func (r *chainRig) relocate(ctx context.Context, group []*transfer) (bool, error) {
	for _, t := range group {
		if t.minedIndex == "" {
			t.minedIndex = t.index
		}
	}
	tr := group[0]
	receipt, err := r.eth.TransactionReceipt(ctx, common.HexToHash(tr.hash))
	if errors.Is(err, ethereum.NotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if receipt.Status != 1 {
		return false, nil
	}
	if tr.asset != chainToken {
		return true, nil
	}
	var at []string
	for _, lg := range receipt.Logs {
		if strings.EqualFold(lg.Address.Hex(), tr.token) && len(lg.Topics) == 3 &&
			strings.EqualFold(common.BytesToAddress(lg.Topics[2].Bytes()).Hex(), tr.to) && new(big.Int).SetBytes(lg.Data).Cmp(tr.base) == 0 {
			at = append(at, fmt.Sprint(lg.Index))
		}
	}
	if len(at) != len(group) {
		return false, nil
	}
	ordered := slices.Clone(group)
	slices.SortFunc(ordered, func(a, b *transfer) int { return cmpIndex(a.minedIndex, b.minedIndex) })
	for i, t := range ordered {
		t.index = at[i]
	}
	return true, nil
}

func cmpIndex(a, b string) int {
	x, _ := strconv.ParseUint(a, 10, 64)
	y, _ := strconv.ParseUint(b, 10, 64)
	return cmp.Compare(x, y)
}

type claimKey struct{ network, txHash, index string }

type claim struct{ eventID string }

func loadChainTransfers(ctx context.Context, pool *pgxpool.Pool) (map[claimKey]claim, error) {
	rows, err := pool.Query(ctx, `SELECT network, tx_hash, transfer_index, event_id FROM chain_transfers`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[claimKey]claim{}
	for rows.Next() {
		var k claimKey
		var c claim
		if err := rows.Scan(&k.network, &k.txHash, &k.index, &c.eventID); err != nil {
			return nil, err
		}
		out[k] = c
	}
	return out, rows.Err()
}

// checkInvariant5 is CONTRACT.md's invariant 5, in SQL of its own: every
// chain_transfers row names exactly one confirmed deposit, and every
// confirmed deposit with a tx_hash has exactly one row.
func checkInvariant5(ctx context.Context, v *verdict, pool *pgxpool.Pool) {
	const kind = "INVARIANT 5 VIOLATED"
	queries := []struct{ what, sql string }{
		{"chain_transfers row naming no confirmed deposit", `
			SELECT ct.tx_hash || ' ' || ct.transfer_index || ' → ' || ct.event_id || ' (' || COALESCE(pe.status || '/' || pe.event_type, 'no such event') || ')'
			FROM chain_transfers ct LEFT JOIN payment_events pe ON pe.event_id = ct.event_id
			WHERE pe.event_id IS NULL OR pe.status <> 'confirmed' OR pe.event_type NOT IN ('deposit', 'airdrop')
			ORDER BY ct.created_at LIMIT 20`},
		{"event named by several chain_transfers rows", `
			SELECT event_id || ': ' || count(*) FROM chain_transfers GROUP BY event_id HAVING count(*) > 1 LIMIT 20`},
		{"confirmed deposit with a tx_hash and not exactly one chain_transfers row", `
			SELECT pe.event_id || ' (' || pe.tx_hash || '): ' || (SELECT count(*) FROM chain_transfers ct WHERE ct.event_id = pe.event_id) || ' rows'
			FROM payment_events pe
			WHERE pe.status = 'confirmed' AND pe.event_type IN ('deposit', 'airdrop') AND pe.tx_hash IS NOT NULL
			  AND (SELECT count(*) FROM chain_transfers ct WHERE ct.event_id = pe.event_id) <> 1
			ORDER BY pe.updated_at LIMIT 20`},
	}
	for _, q := range queries {
		rows, err := pool.Query(ctx, q.sql)
		if err != nil {
			v.fail(kind, "%s: query failed: %v", q.what, err)
			continue
		}
		for rows.Next() {
			var s string
			if rows.Scan(&s) == nil {
				v.fail(kind, "%s: %s", q.what, s)
			}
		}
		if err := rows.Err(); err != nil {
			v.fail(kind, "%s: %v", q.what, err)
		}
		rows.Close()
	}
}

// explainChain accepts a chain event's dead letter only as a retry
// budget spent while the workers could not reach PostgreSQL or the node.
func explainChain(d dlqRow, windows []window, eventCreated time.Time) (string, bool) {
	if why, ok := explain(d, windows, eventCreated); ok {
		return why, true
	}
	if !strings.Contains(d.reason, "retries exhausted") {
		return "", false
	}
	for _, w := range windows {
		switch w.fault.Kind {
		case rpcErrors, rpcReset, rpcLatency, rpcBlackhole:
		default:
			continue
		}
		if overlapsAttempts(w, d, eventCreated) {
			return fmt.Sprintf("retry budget spent during %v", w.fault), true
		}
	}
	return "", false
}

// breakerSampleInterval spaces the reads of the workers' breaker state.
const breakerSampleInterval = 500 * time.Millisecond

// breakerWatch records the RPC breaker's state as the workers report it,
// to show it opened and closed again under the RPC faults.
type breakerWatch struct {
	mu               sync.Mutex
	samples, open    int
	halfOpen, closes int
	last             map[string]int
}

func watchBreaker(ctx context.Context, c *cluster) *breakerWatch {
	w := &breakerWatch{last: map[string]int{}}
	go func() {
		ticker := time.NewTicker(breakerSampleInterval)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			for _, m := range c.members {
				if !strings.HasPrefix(m.name, "worker") || !m.proc.Running() {
					continue
				}
				if state, ok := breakerState(m.proc.URL()); ok {
					w.record(m.name, state)
				}
			}
		}
	}()
	return w
}

func breakerState(base string) (int, bool) {
	resp, err := readyClient.Get(base + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, metricsBytesMax))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, `settle_chain_breaker_state{network="ETH_MAINNET"} `); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err == nil
		}
	}
	return 0, false
}

// metricsBytesMax bounds one /metrics page read.
const metricsBytesMax = 4 << 20

func (w *breakerWatch) record(worker string, state int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples++
	switch state {
	case 2:
		w.open++
	case 1:
		w.halfOpen++
	case 0:
		if w.last[worker] != 0 {
			w.closes++
		}
	}
	w.last[worker] = state
}

func (w *breakerWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("RPC breaker seen open in %d and half-open in %d of %d worker samples, closing again %d times", w.open, w.halfOpen, w.samples, w.closes)
}

// TestBalanceWatchSeesNegative: with the schema's CHECK dropped (a test
// build that lets a bug through), a negative balance is a finding.
func TestBalanceWatchSeesNegative(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, stmt := range []string{
		// Every CHECK of balances (balance >= 0 and whatever joins it).
		`DO $$ DECLARE c text; BEGIN
			FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = 'balances'::regclass AND contype = 'c' LOOP
				EXECUTE format('ALTER TABLE balances DROP CONSTRAINT %I', c);
			END LOOP; END $$`,
		`INSERT INTO users (id) VALUES (1), (2)`,
		`INSERT INTO balances (user_id, asset, balance) VALUES (1, 'ETH', 5), (2, 'ETH', -0.000001)`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	w := &balanceWatch{}
	w.sample(ctx, pool)
	v := &verdict{}
	w.report(v)
	if v.count["NEGATIVE BALANCE"] != 1 || !strings.Contains(v.samples["NEGATIVE BALANCE"][0], "user 2 ETH") {
		t.Fatalf("findings: %v", v.findings())
	}
	if _, err := pool.Exec(ctx, `UPDATE balances SET balance = 0 WHERE user_id = 2`); err != nil {
		t.Fatal(err)
	}
	w, v = &balanceWatch{}, &verdict{}
	w.sample(ctx, pool)
	w.report(v)
	if len(v.kinds) != 0 || w.checks != 1 {
		t.Fatalf("a clean table gave findings %v (checks %d)", v.findings(), w.checks)
	}
}

// reorgOrigin names the deposit a compensation or give-back belongs to:
// "reorg:D", "reorg:return:n:D" and "return:n:D" all name D; "" for any
// other id.
func reorgOrigin(id string) string {
	rest, compensation := strings.CutPrefix(id, "reorg:")
	if r, ok := strings.CutPrefix(rest, payment.ReturnEventIDPrefix); ok {
		if _, d, ok := strings.Cut(r, ":"); ok {
			return d
		}
	}
	if compensation {
		return rest
	}
	return ""
}

func TestReorgOrigin(t *testing.T) {
	for id, want := range map[string]string{
		"reorg:chain:ETH_MAINNET:0x1:native":       "chain:ETH_MAINNET:0x1:native",
		"return:1:chain:ETH_MAINNET:0x1:native":    "chain:ETH_MAINNET:0x1:native",
		"reorg:return:3:pay-7":                     "pay-7",
		payment.CycleCompensationEventID(5, "a:b"): "a:b",
		payment.ReturnEventID(4, "return-less"):    "return-less",
		"chain:ETH_MAINNET:0x1:native":             "",
		"pay-7":                                    "",
	} {
		if got := reorgOrigin(id); got != want {
			t.Errorf("reorgOrigin(%q) = %q, want %q", id, got, want)
		}
	}
}

func sumCounts(m map[string]int) int {
	n := 0
	for _, c := range m {
		n += c
	}
	return n
}
