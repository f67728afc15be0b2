package ledger

import (
	"fmt"
	"math"

	"github.com/settle/settle/pkg/payment"
)

// PayoutClaim is a payout_transfers row: the transfer that settles a post.
type PayoutClaim struct {
	// Transfer names the transfer within its transaction, whatever block
	// mines it: "native", a trace index, or "log:<n>", the transaction's
	// n-th log.
	Transfer string
	// Index and BlockHash say where it was when claimed (a log's index
	// counts within its block).
	Index     string
	BlockHash string
	Asset     string
	EventID   string
}

// PlannedPayout is a payout claim to write, on its transaction.
type PlannedPayout struct {
	Tx    Tx
	Claim PayoutClaim
}

// payoutTransfer names the transfer at index within its transaction: a
// log by its place among the transaction's logs, which a reorg that mines
// the transaction in another block does not change (its index does).
func payoutTransfer(index string, firstLogIndex int64) (string, bool) {
	n, ok := payment.LogIndex(index)
	if !ok {
		return index, true // native or trace: the same in any block
	}
	first := uint64(max(firstLogIndex, 0))
	if n < first || n-first > math.MaxInt32 {
		return "", false // not a log of this transaction: no evidence
	}
	return fmt.Sprintf("log:%d", n-first), true
}

// claimPayout picks the transfer a post settles with: the first of the
// transfers the chain check found paying its hold that no other post
// holds. One transfer pays one hold, so two holds of one amount to one
// address cannot both be posted with one payment. A post the chain did
// not check (a network without an RPC) claims nothing: nothing says
// which of the transaction's transfers it names.
func (p *planner) claimPayout(c Claimed, chain *ChainEvidence) bool {
	e := c.Event
	if chain == nil || chain.BlockHash == "" || len(chain.Transfers) == 0 || e.TxHash == "" {
		return true
	}
	k := Tx{c.Network, e.TxHash}
	taken := map[string]bool{}
	for _, h := range p.payouts[k] {
		if h.EventID == e.ID {
			return true // its own claim (a post replayed after a crash)
		}
		taken[h.Transfer] = true
	}
	for _, index := range chain.Transfers {
		transfer, ok := payoutTransfer(index, chain.FirstLogIndex)
		if !ok || taken[transfer] {
			continue
		}
		claim := PayoutClaim{Transfer: transfer, Index: index, BlockHash: chain.BlockHash, Asset: e.Asset, EventID: e.ID}
		p.payouts[k] = append(p.payouts[k], claim)
		p.w.NewPayouts = append(p.w.NewPayouts, PlannedPayout{Tx: k, Claim: claim})
		return true
	}
	return false
}
