package ledger_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/ledger"
	"github.com/settle/settle/pkg/payment"
)

const (
	network = "ETH_MAINNET"
	txA     = "0xa1"
	txB     = "0xb2"
	blockA  = "0xaa"
	blockB  = "0xbb"
)

func d(s string) decimal.Decimal { return decimal.RequireFromString(s) }

// acct reads "1/ETH" as user 1's ETH balance.
func acct(s string) ledger.Account {
	user, asset, _ := strings.Cut(s, "/")
	n, err := strconv.ParseInt(user, 10, 64)
	if err != nil {
		panic(err)
	}
	return ledger.Account{User: n, Asset: asset}
}

func accounts(m map[string]string) map[ledger.Account]decimal.Decimal {
	out := map[ledger.Account]decimal.Decimal{}
	for k, v := range m {
		out[acct(k)] = d(v)
	}
	return out
}

// ev is one event of a table row, accepted in the order of the row
// unless at says otherwise. ETH is the network's own coin.
type ev struct {
	id     string
	typ    payment.EventType
	user   int64
	asset  string
	amount string
	tx     string // a deposit's transaction
	index  string // the transfer its sender named
	hold   string // the hold a post or void names
	on     string // its network, the const network when empty
	at     int
}

func claimed(events []ev) []ledger.Claimed {
	out := make([]ledger.Claimed, len(events))
	for i, e := range events {
		at := e.at
		if at == 0 {
			at = i + 1
		}
		asset := e.asset
		if asset == "" {
			asset = "ETH"
		}
		on := e.on
		if on == "" {
			on = network
		}
		c := ledger.Claimed{
			Event: payment.Event{ID: e.id, Type: e.typ, UserID: e.user, Asset: asset, Amount: d(e.amount),
				TxHash: e.tx, TransferIndex: e.index, HoldID: e.hold, TraceID: "trace-" + e.id},
			CreatedAt: time.Unix(int64(at), 0), Key: payment.IdempotencyKey(e.id, e.typ), Item: i,
			Network: on, HoldID: e.hold,
		}
		if e.typ == payment.WithdrawalHold {
			c.HoldNetwork, c.ToAddress = on, "0xto"
			c.Event.Network, c.Event.ToAddress = on, "0xto"
		}
		out[i] = c
	}
	return out
}

// twoHolds are two open holds of user 1 (one, if the ids are equal).
func twoHolds(a, b, amount string) map[string]*ledger.Hold {
	out := openHold(a, 1, amount, payment.HoldOpen)
	out[b] = openHold(b, 1, amount, payment.HoldOpen)[b]
	return out
}

func openHold(id string, user int64, amount string, status payment.HoldStatus) map[string]*ledger.Hold {
	return map[string]*ledger.Hold{id: {ID: id, User: user, Asset: "ETH", Amount: d(amount), Status: status, Network: network}}
}

// want is what a row expects Plan to write. Lists are exact and in
// order; a nil list expects nothing.
type want struct {
	// outcomes by event id of every result; "" is an item told to wait
	// (Retry) with its row left enqueued.
	outcomes map[string]payment.Outcome
	// balances and held after the batch (every account of the row).
	balances, held map[string]string
	// journal rows as "event:type:signed amount".
	journal []string
	// notifications as "kind:event:balance in the payload".
	notifications []string
	// claims written as "event@index" ("event@index/block+position" for a
	// log claimed with its block), moved claims likewise.
	claims, moved []string
	// payouts written as "post@transfer=index/block".
	payouts     []string
	opened      []string // holds opened
	resolved    []ledger.HoldResolution
	deadLetters []string // events dead-lettered
	alerts      []string // events whose result asks a human now
	rollback    []string // events the transaction rolls back for
	reopened    []string // events whose dead-lettered key is updated
	// pulled are the outcomes of the pulled hold events Plan applied.
	pulled map[string]payment.Outcome
}

type row struct {
	name       string
	events     []ev
	chain      map[string]*ledger.ChainEvidence // by event id
	replays    map[string]payment.Outcome       // by event id
	balances   map[string]string
	held       map[string]string
	claims     map[ledger.Tx][]ledger.TransferClaim
	payouts    map[ledger.Tx][]ledger.PayoutClaim
	holds      map[string]*ledger.Hold
	holdEvents map[string]payment.Status
	// pulled are hold events the storage locked for the row's posts and
	// voids; their at orders them among the events.
	pulled []ev
	want   want
}

func chainOf(block string, first int64, transfers ...string) *ledger.ChainEvidence {
	return &ledger.ChainEvidence{BlockNumber: 9, BlockHash: block, FirstLogIndex: first, Transfers: transfers}
}

func logClaim(event, index, block string, position int64) ledger.TransferClaim {
	return ledger.TransferClaim{Index: index, Asset: "USDC", EventID: event, BlockHash: block, Position: position}
}

var rows = []row{
	// Credits.
	{
		name:     "deposit credits",
		events:   []ev{{id: "dep-1", typ: payment.Deposit, user: 1, amount: "1.5"}},
		balances: map[string]string{"1/ETH": "0"},
		want: want{outcomes: map[string]payment.Outcome{"dep-1": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "1.5"},
			journal: []string{"dep-1:deposit:1.5"}, notifications: []string{"deposit_credited:dep-1:1.5"}},
	},
	{
		name:     "airdrop credits",
		events:   []ev{{id: "air", typ: payment.Airdrop, user: 1, asset: "USDC", amount: "0.5"}},
		balances: map[string]string{"1/USDC": "10"},
		want: want{outcomes: map[string]payment.Outcome{"air": payment.OutcomeSuccess}, balances: map[string]string{"1/USDC": "10.5"},
			journal: []string{"air:airdrop:0.5"}, notifications: []string{"deposit_credited:air:10.5"}},
	},
	{
		name:     "credit past 10^20 is dead-lettered",
		events:   []ev{{id: "huge", typ: payment.Deposit, user: 1, amount: "1"}},
		balances: map[string]string{"1/ETH": "99999999999999999999"},
		want: want{outcomes: map[string]payment.Outcome{"huge": payment.OutcomeDeadLettered}, balances: map[string]string{"1/ETH": "99999999999999999999"},
			deadLetters: []string{"huge"}},
	},
	{
		name:     "unknown user or asset is dead-lettered",
		events:   []ev{{id: "nobody", typ: payment.Deposit, user: 9, amount: "1"}},
		balances: map[string]string{"1/ETH": "0"},
		want: want{outcomes: map[string]payment.Outcome{"nobody": payment.OutcomeDeadLettered}, balances: map[string]string{"1/ETH": "0"},
			deadLetters: []string{"nobody"}},
	},

	// Replays: a recorded outcome brings the event to its status, moving nothing.
	{
		name:     "replayed success confirms without money",
		events:   []ev{{id: "r", typ: payment.Deposit, user: 1, amount: "1"}},
		replays:  map[string]payment.Outcome{"r": payment.OutcomeSuccess},
		balances: map[string]string{"1/ETH": "5"},
		want:     want{outcomes: map[string]payment.Outcome{"r": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "5"}},
	},
	{
		name:     "replayed insufficient_funds fails without money",
		events:   []ev{{id: "r", typ: payment.Withdrawal, user: 1, amount: "1"}},
		replays:  map[string]payment.Outcome{"r": payment.OutcomeInsufficientFunds},
		balances: map[string]string{"1/ETH": "5"},
		want:     want{outcomes: map[string]payment.Outcome{"r": payment.OutcomeInsufficientFunds}, balances: map[string]string{"1/ETH": "5"}},
	},
	{
		name:     "replayed reorged fails without money",
		events:   []ev{{id: "r", typ: payment.Deposit, user: 1, amount: "1"}},
		replays:  map[string]payment.Outcome{"r": payment.OutcomeReorged},
		balances: map[string]string{"1/ETH": "5"},
		want:     want{outcomes: map[string]payment.Outcome{"r": payment.OutcomeReorged}, balances: map[string]string{"1/ETH": "5"}},
	},
	{
		name:     "replayed mismatch fails without money",
		events:   []ev{{id: "r", typ: payment.Deposit, user: 1, amount: "1"}},
		replays:  map[string]payment.Outcome{"r": payment.OutcomeMismatch},
		balances: map[string]string{"1/ETH": "5"},
		want:     want{outcomes: map[string]payment.Outcome{"r": payment.OutcomeMismatch}, balances: map[string]string{"1/ETH": "5"}},
	},
	{
		name:     "replayed held confirms the hold without reserving again",
		events:   []ev{{id: "h", typ: payment.WithdrawalHold, user: 1, amount: "1"}},
		replays:  map[string]payment.Outcome{"h": payment.OutcomeHeld},
		balances: map[string]string{"1/ETH": "5"},
		want:     want{outcomes: map[string]payment.Outcome{"h": payment.OutcomeHeld}, balances: map[string]string{"1/ETH": "5"}},
	},
	{
		name: "pending key rolls back its item, the rest goes through",
		events: []ev{{id: "pending", typ: payment.Deposit, user: 1, amount: "1"},
			{id: "other", typ: payment.Deposit, user: 1, amount: "2"}},
		replays:  map[string]payment.Outcome{"pending": payment.OutcomePending},
		balances: map[string]string{"1/ETH": "0"},
		want: want{outcomes: map[string]payment.Outcome{"other": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "2"},
			journal: []string{"other:deposit:2"}, notifications: []string{"deposit_credited:other:2"}, rollback: []string{"pending"}},
	},
	{
		name:     "dead-lettered key replayed by a human moves money and updates its key",
		events:   []ev{{id: "again", typ: payment.Deposit, user: 1, amount: "3"}},
		replays:  map[string]payment.Outcome{"again": payment.OutcomeDeadLettered},
		balances: map[string]string{"1/ETH": "0"},
		want: want{outcomes: map[string]payment.Outcome{"again": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "3"},
			journal: []string{"again:deposit:3"}, notifications: []string{"deposit_credited:again:3"}, reopened: []string{"again"}},
	},

	// Debits take only from available, first come first served.
	{
		name:     "withdrawal debits",
		events:   []ev{{id: "w", typ: payment.Withdrawal, user: 1, amount: "4"}},
		balances: map[string]string{"1/ETH": "10"},
		want: want{outcomes: map[string]payment.Outcome{"w": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "6"},
			journal: []string{"w:withdrawal:-4"}, notifications: []string{"withdrawal_confirmed:w:6"}},
	},
	{
		name:     "withdrawal of the whole balance",
		events:   []ev{{id: "w", typ: payment.Withdrawal, user: 1, amount: "10"}},
		balances: map[string]string{"1/ETH": "10"},
		want: want{outcomes: map[string]payment.Outcome{"w": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "0"},
			journal: []string{"w:withdrawal:-10"}, notifications: []string{"withdrawal_confirmed:w:0"}},
	},
	{
		name:     "withdrawal past the balance is insufficient_funds, no journal",
		events:   []ev{{id: "w", typ: payment.Withdrawal, user: 1, amount: "10.000000000000000001"}},
		balances: map[string]string{"1/ETH": "10"},
		want: want{outcomes: map[string]payment.Outcome{"w": payment.OutcomeInsufficientFunds}, balances: map[string]string{"1/ETH": "10"},
			notifications: []string{"insufficient_funds:w:10"}},
	},
	{
		name:     "withdrawal within available passes the hold",
		events:   []ev{{id: "w", typ: payment.Withdrawal, user: 1, amount: "70"}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		want: want{outcomes: map[string]payment.Outcome{"w": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "30"},
			held: map[string]string{"1/ETH": "30"}, journal: []string{"w:withdrawal:-70"}, notifications: []string{"withdrawal_confirmed:w:30/0"}},
	},
	{
		name:     "withdrawal behind a hold is refused though the balance covers it",
		events:   []ev{{id: "w", typ: payment.Withdrawal, user: 1, amount: "80"}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		want: want{outcomes: map[string]payment.Outcome{"w": payment.OutcomeInsufficientFunds}, balances: map[string]string{"1/ETH": "100"},
			held: map[string]string{"1/ETH": "30"}, notifications: []string{"insufficient_funds:w:100/70"}},
	},
	{
		name: "first come first served against the running balance",
		events: []ev{
			{id: "a", typ: payment.Deposit, user: 2, amount: "3.000000000000000001"},
			{id: "b", typ: payment.Withdrawal, user: 1, asset: "USDC", amount: "4"},
			{id: "c", typ: payment.Withdrawal, user: 1, asset: "USDC", amount: "4"},
			{id: "fee", typ: payment.WithdrawalFee, user: 1, asset: "USDC", amount: "4"},
			{id: "e", typ: payment.Airdrop, user: 1, asset: "USDC", amount: "0.5"},
		},
		balances: map[string]string{"1/USDC": "10", "2/ETH": "0"},
		want: want{
			outcomes: map[string]payment.Outcome{"a": payment.OutcomeSuccess, "b": payment.OutcomeSuccess, "c": payment.OutcomeSuccess,
				"fee": payment.OutcomeInsufficientFunds, "e": payment.OutcomeSuccess},
			balances: map[string]string{"1/USDC": "2.5", "2/ETH": "3.000000000000000001"},
			journal:  []string{"b:withdrawal:-4", "c:withdrawal:-4", "e:airdrop:0.5", "a:deposit:3.000000000000000001"},
			notifications: []string{"withdrawal_confirmed:b:6", "withdrawal_confirmed:c:2", "insufficient_funds:fee:2",
				"deposit_credited:e:2.5", "deposit_credited:a:3.000000000000000001"},
		},
	},
	{
		name: "the earlier accepted withdrawal wins whatever the batch or id order",
		events: []ev{
			{id: "a-late", typ: payment.Withdrawal, user: 1, amount: "6", at: 20},
			{id: "z-early", typ: payment.Withdrawal, user: 1, amount: "6", at: 10},
		},
		balances: map[string]string{"1/ETH": "10"},
		want: want{outcomes: map[string]payment.Outcome{"z-early": payment.OutcomeSuccess, "a-late": payment.OutcomeInsufficientFunds},
			balances: map[string]string{"1/ETH": "4"}, journal: []string{"z-early:withdrawal:-6"},
			notifications: []string{"withdrawal_confirmed:z-early:4", "insufficient_funds:a-late:4"}},
	},
	{
		name:     "withdrawal_fee debits",
		events:   []ev{{id: "fee", typ: payment.WithdrawalFee, user: 1, amount: "0.1"}},
		balances: map[string]string{"1/ETH": "1"},
		want: want{outcomes: map[string]payment.Outcome{"fee": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "0.9"},
			journal: []string{"fee:withdrawal_fee:-0.1"}, notifications: []string{"withdrawal_confirmed:fee:0.9"}},
	},
	{
		name:     "a deposit earlier in the batch funds a withdrawal",
		events:   []ev{{id: "dep", typ: payment.Deposit, user: 1, amount: "5"}, {id: "w", typ: payment.Withdrawal, user: 1, amount: "5"}},
		balances: map[string]string{"1/ETH": "0"},
		want: want{outcomes: map[string]payment.Outcome{"dep": payment.OutcomeSuccess, "w": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "0"},
			journal: []string{"dep:deposit:5", "w:withdrawal:-5"}, notifications: []string{"deposit_credited:dep:5", "withdrawal_confirmed:w:0"}},
	},

	// Reorg compensation.
	{
		name:     "reorg_compensation debits a credited deposit",
		events:   []ev{{id: "reorg:dep", typ: payment.ReorgCompensation, user: 1, asset: "USDC", amount: "5"}},
		balances: map[string]string{"1/USDC": "5"},
		want: want{outcomes: map[string]payment.Outcome{"reorg:dep": payment.OutcomeSuccess}, balances: map[string]string{"1/USDC": "0"},
			journal: []string{"reorg:dep:reorg_compensation:-5"}, notifications: []string{"deposit_reversed:reorg:dep:0"}},
	},
	{
		name:     "reorg_compensation the balance cannot cover goes to the DLQ with an alert",
		events:   []ev{{id: "reorg:dep", typ: payment.ReorgCompensation, user: 1, amount: "5"}},
		balances: map[string]string{"1/ETH": "1"},
		want: want{outcomes: map[string]payment.Outcome{"reorg:dep": payment.OutcomeDeadLettered}, balances: map[string]string{"1/ETH": "1"},
			deadLetters: []string{"reorg:dep"}, alerts: []string{"reorg:dep"}},
	},
	{
		name:     "reorg_compensation takes only from available too",
		events:   []ev{{id: "reorg:dep", typ: payment.ReorgCompensation, user: 1, amount: "4"}},
		balances: map[string]string{"1/ETH": "5"}, held: map[string]string{"1/ETH": "3"},
		want: want{outcomes: map[string]payment.Outcome{"reorg:dep": payment.OutcomeDeadLettered}, balances: map[string]string{"1/ETH": "5"},
			held: map[string]string{"1/ETH": "3"}, deadLetters: []string{"reorg:dep"}, alerts: []string{"reorg:dep"}},
	},

	// Transfer claims.
	{
		name:     "a deposit claims the first free transfer candidate",
		events:   []ev{{id: "p1", typ: payment.Deposit, user: 1, amount: "2", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"p1": chainOf(blockA, 0, payment.TransferNative)},
		balances: map[string]string{"1/ETH": "0"},
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "2"},
			journal: []string{"p1:deposit:2"}, notifications: []string{"deposit_credited:p1:2"}, claims: []string{"p1@native"}},
	},
	{
		name:     "a second claim of a held transfer is duplicate_transfer",
		events:   []ev{{id: "p2", typ: payment.Deposit, user: 1, amount: "2", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"p2": chainOf(blockA, 0, payment.TransferNative)},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {{Index: payment.TransferNative, Asset: "ETH", EventID: "p1", Position: -1}}},
		balances: map[string]string{"1/ETH": "2"},
		want:     want{outcomes: map[string]payment.Outcome{"p2": payment.OutcomeDuplicateTransfer}, balances: map[string]string{"1/ETH": "2"}},
	},
	{
		name: "two deposits of one transfer in one batch credit once",
		events: []ev{{id: "a", typ: payment.Deposit, user: 1, amount: "1", tx: txA},
			{id: "b", typ: payment.Deposit, user: 1, amount: "1", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"a": chainOf(blockA, 0, payment.TransferNative), "b": chainOf(blockA, 0, payment.TransferNative)},
		balances: map[string]string{"1/ETH": "0"},
		want: want{outcomes: map[string]payment.Outcome{"a": payment.OutcomeSuccess, "b": payment.OutcomeDuplicateTransfer},
			balances: map[string]string{"1/ETH": "1"}, journal: []string{"a:deposit:1"}, notifications: []string{"deposit_credited:a:1"},
			claims: []string{"a@native"}},
	},
	{
		name:     "its own claim is no duplicate (a credit replayed after a crash)",
		events:   []ev{{id: "p1", typ: payment.Deposit, user: 1, amount: "2", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"p1": chainOf(blockA, 0, payment.TransferNative)},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {{Index: payment.TransferNative, Asset: "ETH", EventID: "p1", Position: -1}}},
		balances: map[string]string{"1/ETH": "0"},
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "2"},
			journal: []string{"p1:deposit:2"}, notifications: []string{"deposit_credited:p1:2"}},
	},
	{
		name: "two identical logs: one claim each, the third is a duplicate",
		events: []ev{{id: "log-0", typ: payment.Deposit, user: 1, asset: "USDC", amount: "10", tx: txA},
			{id: "log-1", typ: payment.Deposit, user: 1, asset: "USDC", amount: "10", tx: txA},
			{id: "log-2", typ: payment.Deposit, user: 1, asset: "USDC", amount: "10", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"log-0": chainOf(blockA, 0, "3", "5"), "log-1": chainOf(blockA, 0, "3", "5"), "log-2": chainOf(blockA, 0, "3", "5")},
		balances: map[string]string{"1/USDC": "0"},
		want: want{outcomes: map[string]payment.Outcome{"log-0": payment.OutcomeSuccess, "log-1": payment.OutcomeSuccess, "log-2": payment.OutcomeDuplicateTransfer},
			balances: map[string]string{"1/USDC": "20"}, journal: []string{"log-0:deposit:10", "log-1:deposit:10"},
			notifications: []string{"deposit_credited:log-0:10", "deposit_credited:log-1:20"},
			claims:        []string{"log-0@3/" + blockA + "+3", "log-1@5/" + blockA + "+5"}},
	},
	{
		name:     "a named transfer is claimed; another deposit takes the other transfer",
		events:   []ev{{id: "any", typ: payment.Deposit, user: 1, asset: "USDC", amount: "10", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"any": chainOf(blockA, 3, "3", "5")},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {logClaim("named-5", "5", blockA, 2)}},
		balances: map[string]string{"1/USDC": "10"},
		want: want{outcomes: map[string]payment.Outcome{"any": payment.OutcomeSuccess}, balances: map[string]string{"1/USDC": "20"},
			journal: []string{"any:deposit:10"}, notifications: []string{"deposit_credited:any:20"}, claims: []string{"any@3/" + blockA + "+0"}},
	},
	{
		name: "without a chain check a deposit is what it names, or an unresolved claim",
		events: []ev{
			{id: "eth-1", typ: payment.Deposit, user: 1, amount: "1", tx: txA},
			{id: "eth-2", typ: payment.Deposit, user: 1, amount: "1", tx: txA},
			{id: "usdc-1", typ: payment.Deposit, user: 1, asset: "USDC", amount: "5", tx: txA},
			{id: "usdc-log", typ: payment.Deposit, user: 1, asset: "USDC", amount: "5", tx: txA, index: "9"},
			{id: "usdc-other", typ: payment.Deposit, user: 1, asset: "USDC", amount: "5", tx: txB, index: "9"},
		},
		balances: map[string]string{"1/ETH": "0", "1/USDC": "0"},
		want: want{
			outcomes: map[string]payment.Outcome{"eth-1": payment.OutcomeSuccess, "eth-2": payment.OutcomeDuplicateTransfer,
				"usdc-1": payment.OutcomeSuccess, "usdc-log": payment.OutcomeDuplicateTransfer, "usdc-other": payment.OutcomeSuccess},
			balances:      map[string]string{"1/ETH": "1", "1/USDC": "10"},
			journal:       []string{"eth-1:deposit:1", "usdc-1:deposit:5", "usdc-other:deposit:5"},
			notifications: []string{"deposit_credited:eth-1:1", "deposit_credited:usdc-1:5", "deposit_credited:usdc-other:10"},
			claims:        []string{"eth-1@" + payment.UnresolvedTransfer("eth-1"), "usdc-1@" + payment.UnresolvedTransfer("usdc-1"), "usdc-other@9"},
		},
	},
	{
		// The payments deposit may be ETH a contract call paid (a smart
		// wallet's send), which a provider reports as trace:<address>.
		name: "without a chain check an ETH deposit naming no transfer counts against the internal transfers too",
		events: []ev{
			{id: "pay-1", typ: payment.Deposit, user: 1, amount: "1", tx: txA},
			{id: "internal", typ: payment.Deposit, user: 1, amount: "1", tx: txA, index: "trace:call_0"},
			{id: "own-value", typ: payment.Deposit, user: 1, amount: "1", tx: txA, index: payment.TransferNative},
		},
		balances: map[string]string{"1/ETH": "0"},
		want: want{
			outcomes: map[string]payment.Outcome{"pay-1": payment.OutcomeSuccess, "internal": payment.OutcomeDuplicateTransfer,
				"own-value": payment.OutcomeDuplicateTransfer},
			balances:      map[string]string{"1/ETH": "1"},
			journal:       []string{"pay-1:deposit:1"},
			notifications: []string{"deposit_credited:pay-1:1"},
			claims:        []string{"pay-1@" + payment.UnresolvedTransfer("pay-1")},
		},
	},
	{
		name:     "without a chain check an ETH deposit naming no transfer is a duplicate of a claimed internal one",
		events:   []ev{{id: "pay-2", typ: payment.Deposit, user: 1, amount: "1", tx: txA}},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {{Index: "trace:call_0", Asset: "ETH", EventID: "internal", Position: -1}}},
		balances: map[string]string{"1/ETH": "1"},
		want:     want{outcomes: map[string]payment.Outcome{"pay-2": payment.OutcomeDuplicateTransfer}, balances: map[string]string{"1/ETH": "1"}},
	},
	{
		name:     "an unresolved claim replayed is its own",
		events:   []ev{{id: "usdc-1", typ: payment.Deposit, user: 1, asset: "USDC", amount: "5", tx: txA}},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {{Index: payment.UnresolvedTransfer("usdc-1"), Asset: "USDC", EventID: "usdc-1", Position: -1}}},
		balances: map[string]string{"1/USDC": "0"},
		want: want{outcomes: map[string]payment.Outcome{"usdc-1": payment.OutcomeSuccess}, balances: map[string]string{"1/USDC": "5"},
			journal: []string{"usdc-1:deposit:5"}, notifications: []string{"deposit_credited:usdc-1:5"}},
	},
	{
		name:     "an unresolved claim of the asset refuses a guess without a chain check",
		events:   []ev{{id: "usdc-2", typ: payment.Deposit, user: 1, asset: "USDC", amount: "5", tx: txA}},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {{Index: payment.UnresolvedTransfer("usdc-1"), Asset: "USDC", EventID: "usdc-1", Position: -1}}},
		balances: map[string]string{"1/USDC": "5"},
		want:     want{outcomes: map[string]payment.Outcome{"usdc-2": payment.OutcomeDuplicateTransfer}, balances: map[string]string{"1/USDC": "5"}},
	},
	{
		name:     "unresolved claims count against the transfers of the same asset",
		events:   []ev{{id: "checked", typ: payment.Deposit, user: 1, asset: "USDC", amount: "5", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"checked": chainOf(blockA, 0, "4", "9")},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {{Index: payment.UnresolvedTransfer("usdc-1"), Asset: "USDC", EventID: "usdc-1", Position: -1}}},
		balances: map[string]string{"1/USDC": "5"},
		want: want{outcomes: map[string]payment.Outcome{"checked": payment.OutcomeSuccess}, balances: map[string]string{"1/USDC": "10"},
			journal: []string{"checked:deposit:5"}, notifications: []string{"deposit_credited:checked:10"}, claims: []string{"checked@9/" + blockA + "+9"}},
	},
	{
		name:     "an unresolved claim of another asset does not count",
		events:   []ev{{id: "checked", typ: payment.Deposit, user: 1, asset: "USDC", amount: "5", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"checked": chainOf(blockA, 0, "4")},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {{Index: payment.UnresolvedTransfer("dai-1"), Asset: "DAI", EventID: "dai-1", Position: -1}}},
		balances: map[string]string{"1/USDC": "0"},
		want: want{outcomes: map[string]payment.Outcome{"checked": payment.OutcomeSuccess}, balances: map[string]string{"1/USDC": "5"},
			journal: []string{"checked:deposit:5"}, notifications: []string{"deposit_credited:checked:5"}, claims: []string{"checked@4/" + blockA + "+4"}},
	},
	{
		name:     "a claim made in another block follows the transaction: the same transfer is a duplicate",
		events:   []ev{{id: "moved-again", typ: payment.Deposit, user: 1, asset: "USDC", amount: "10", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"moved-again": chainOf(blockB, 10, "12")},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {logClaim("moved-first", "5", blockA, 2)}},
		balances: map[string]string{"1/USDC": "10"},
		want: want{outcomes: map[string]payment.Outcome{"moved-again": payment.OutcomeDuplicateTransfer}, balances: map[string]string{"1/USDC": "10"},
			moved: []string{"moved-first@12/" + blockB + "+2"}},
	},
	{
		name:     "a claim made in another block follows the transaction: another transfer is free",
		events:   []ev{{id: "moved-other", typ: payment.Deposit, user: 1, asset: "USDC", amount: "10", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"moved-other": chainOf(blockB, 10, "11", "12")},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {logClaim("moved-first", "5", blockA, 2)}},
		balances: map[string]string{"1/USDC": "10"},
		want: want{outcomes: map[string]payment.Outcome{"moved-other": payment.OutcomeSuccess}, balances: map[string]string{"1/USDC": "20"},
			journal: []string{"moved-other:deposit:10"}, notifications: []string{"deposit_credited:moved-other:20"},
			moved: []string{"moved-first@12/" + blockB + "+2"}, claims: []string{"moved-other@11/" + blockB + "+1"}},
	},
	// Seed 4701253035119547: one transaction with two identical logs,
	// reported in block B at 2 and 3, mined again in block A at 3 and 4.
	// The chain check offers a deposit both logs, its named one first:
	// either twin, read on either branch, finds the other log free.
	{
		name:     "twin logs: the named log holds its twin's claim, followed to the block, so the other credits",
		events:   []ev{{id: "twin-3", typ: payment.Deposit, user: 1, asset: "USDC", amount: "10", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"twin-3": chainOf(blockA, 3, "3", "4")},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {logClaim("twin-2", "2", blockB, 0)}},
		balances: map[string]string{"1/USDC": "10"},
		want: want{outcomes: map[string]payment.Outcome{"twin-3": payment.OutcomeSuccess}, balances: map[string]string{"1/USDC": "20"},
			journal: []string{"twin-3:deposit:10"}, notifications: []string{"deposit_credited:twin-3:20"},
			moved: []string{"twin-2@3/" + blockA + "+0"}, claims: []string{"twin-3@4/" + blockA + "+1"}},
	},
	{
		name:     "twin logs: the other order",
		events:   []ev{{id: "twin-2", typ: payment.Deposit, user: 1, asset: "USDC", amount: "10", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"twin-2": chainOf(blockB, 2, "2", "3")},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {logClaim("twin-3", "3", blockA, 0)}},
		balances: map[string]string{"1/USDC": "10"},
		want: want{outcomes: map[string]payment.Outcome{"twin-2": payment.OutcomeSuccess}, balances: map[string]string{"1/USDC": "20"},
			journal: []string{"twin-2:deposit:10"}, notifications: []string{"deposit_credited:twin-2:20"},
			moved: []string{"twin-3@2/" + blockB + "+0"}, claims: []string{"twin-2@3/" + blockB + "+1"}},
	},
	{
		name:   "twin logs: both held, a third report is the duplicate",
		events: []ev{{id: "twin-4", typ: payment.Deposit, user: 1, asset: "USDC", amount: "10", tx: txA}},
		chain:  map[string]*ledger.ChainEvidence{"twin-4": chainOf(blockA, 3, "4", "3")},
		claims: map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {
			logClaim("twin-2", "2", blockB, 0), logClaim("twin-3", "3", blockB, 1)}},
		balances: map[string]string{"1/USDC": "20"},
		want: want{outcomes: map[string]payment.Outcome{"twin-4": payment.OutcomeDuplicateTransfer}, balances: map[string]string{"1/USDC": "20"},
			moved: []string{"twin-2@3/" + blockA + "+0", "twin-3@4/" + blockA + "+1"}},
	},
	{
		name:     "a claim in the block the chain shows does not move",
		events:   []ev{{id: "same", typ: payment.Deposit, user: 1, asset: "USDC", amount: "10", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"same": chainOf(blockA, 3, "5")},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: network, TxHash: txA}: {logClaim("first", "5", blockA, 2)}},
		balances: map[string]string{"1/USDC": "10"},
		want:     want{outcomes: map[string]payment.Outcome{"same": payment.OutcomeDuplicateTransfer}, balances: map[string]string{"1/USDC": "10"}},
	},
	{
		name:     "claims on the same transaction hash of another network do not count",
		events:   []ev{{id: "p", typ: payment.Deposit, user: 1, amount: "2", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"p": chainOf(blockA, 0, payment.TransferNative)},
		claims:   map[ledger.Tx][]ledger.TransferClaim{{Network: "BASE_MAINNET", TxHash: txA}: {{Index: payment.TransferNative, Asset: "ETH", EventID: "q", Position: -1}}},
		balances: map[string]string{"1/ETH": "0"},
		want: want{outcomes: map[string]payment.Outcome{"p": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "2"},
			journal: []string{"p:deposit:2"}, notifications: []string{"deposit_credited:p:2"}, claims: []string{"p@native"}},
	},

	// Holds.
	{
		name: "holds reserve until available runs out",
		events: []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "60"},
			{id: "h2", typ: payment.WithdrawalHold, user: 1, amount: "50"},
			{id: "h3", typ: payment.WithdrawalHold, user: 1, amount: "40"}},
		balances: map[string]string{"1/ETH": "100"},
		want: want{outcomes: map[string]payment.Outcome{"h1": payment.OutcomeHeld, "h2": payment.OutcomeInsufficientFunds, "h3": payment.OutcomeHeld},
			balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "100"},
			opened: []string{"h1", "h3"}, notifications: []string{"insufficient_funds:h2:100/40"}},
	},
	{
		name:     "post turns the hold into a journal debit and releases held",
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h0"}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		holds: openHold("h0", 1, "30", payment.HoldOpen), holdEvents: map[string]payment.Status{"h0": payment.StatusConfirmed},
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "70"}, held: map[string]string{"1/ETH": "0"},
			journal: []string{"p1:withdrawal:-30"}, notifications: []string{"withdrawal_posted:p1:70"},
			resolved: []ledger.HoldResolution{{HoldID: "h0", Status: payment.HoldPosted, By: "p1"}}},
	},
	{
		name:     "void releases the hold, no journal",
		events:   []ev{{id: "v1", typ: payment.WithdrawalVoid, user: 1, amount: "30", hold: "h0"}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		holds: openHold("h0", 1, "30", payment.HoldOpen),
		want: want{outcomes: map[string]payment.Outcome{"v1": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "0"},
			notifications: []string{"hold_voided:v1:100"}, resolved: []ledger.HoldResolution{{HoldID: "h0", Status: payment.HoldVoided, By: "v1"}}},
	},
	{
		name: "void then post in one batch: the post finds the hold closed",
		events: []ev{{id: "v1", typ: payment.WithdrawalVoid, user: 1, amount: "30", hold: "h0"},
			{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h0"}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		holds: openHold("h0", 1, "30", payment.HoldOpen),
		want: want{outcomes: map[string]payment.Outcome{"v1": payment.OutcomeSuccess, "p1": payment.OutcomeHoldClosed},
			balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "0"},
			notifications: []string{"hold_voided:v1:100"}, resolved: []ledger.HoldResolution{{HoldID: "h0", Status: payment.HoldVoided, By: "v1"}}},
	},
	// Payouts: one transfer settles one post.
	{
		name: "two posts naming one payment: the first settles, the second is duplicate_transfer and its hold stays open",
		events: []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h0", tx: txA},
			{id: "p2", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h1", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"p1": chainOf(blockA, 0, payment.TransferNative), "p2": chainOf(blockA, 0, payment.TransferNative)},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "60"},
		holds: twoHolds("h0", "h1", "30"),
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeSuccess, "p2": payment.OutcomeDuplicateTransfer},
			balances: map[string]string{"1/ETH": "70"}, held: map[string]string{"1/ETH": "30"},
			journal: []string{"p1:withdrawal:-30"}, notifications: []string{"withdrawal_posted:p1:70/40"},
			payouts:  []string{"p1@native=native/" + blockA},
			resolved: []ledger.HoldResolution{{HoldID: "h0", Status: payment.HoldPosted, By: "p1"}}},
	},
	{
		name: "a payment of two matching transfers settles two posts",
		events: []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h0", tx: txA},
			{id: "p2", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h1", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"p1": chainOf(blockA, 3, "4", "6"), "p2": chainOf(blockA, 3, "4", "6")},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "60"},
		holds: twoHolds("h0", "h1", "30"),
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeSuccess, "p2": payment.OutcomeSuccess},
			balances: map[string]string{"1/ETH": "40"}, held: map[string]string{"1/ETH": "0"},
			journal: []string{"p1:withdrawal:-30", "p2:withdrawal:-30"}, notifications: []string{"withdrawal_posted:p1:70/40", "withdrawal_posted:p2:40"},
			payouts:  []string{"p1@log:1=4/" + blockA, "p2@log:3=6/" + blockA},
			resolved: []ledger.HoldResolution{{HoldID: "h0", Status: payment.HoldPosted, By: "p1"}, {HoldID: "h1", Status: payment.HoldPosted, By: "p2"}}},
	},
	{
		name:     "a transfer claimed in another block is still taken: its place in the transaction is the same",
		events:   []ev{{id: "p2", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h1", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"p2": chainOf(blockB, 10, "11")},
		payouts:  map[ledger.Tx][]ledger.PayoutClaim{{Network: network, TxHash: txA}: {{Transfer: "log:1", Index: "4", BlockHash: blockA, Asset: "ETH", EventID: "p1"}}},
		balances: map[string]string{"1/ETH": "70"}, held: map[string]string{"1/ETH": "30"},
		holds: twoHolds("h1", "h1", "30"),
		want: want{outcomes: map[string]payment.Outcome{"p2": payment.OutcomeDuplicateTransfer},
			balances: map[string]string{"1/ETH": "70"}, held: map[string]string{"1/ETH": "30"}},
	},
	{
		name:     "a post finds its own claim (replayed after a crash) and claims nothing more",
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h0", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"p1": chainOf(blockA, 0, payment.TransferNative)},
		payouts:  map[ledger.Tx][]ledger.PayoutClaim{{Network: network, TxHash: txA}: {{Transfer: "native", Index: "native", BlockHash: blockA, Asset: "ETH", EventID: "p1"}}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		holds: openHold("h0", 1, "30", payment.HoldOpen),
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "70"}, held: map[string]string{"1/ETH": "0"},
			journal: []string{"p1:withdrawal:-30"}, notifications: []string{"withdrawal_posted:p1:70"},
			resolved: []ledger.HoldResolution{{HoldID: "h0", Status: payment.HoldPosted, By: "p1"}}},
	},
	{
		name: "posts the chain did not check claim nothing",
		events: []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h0", tx: txA},
			{id: "p2", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h1", tx: txA}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "60"},
		holds: twoHolds("h0", "h1", "30"),
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeSuccess, "p2": payment.OutcomeSuccess},
			balances: map[string]string{"1/ETH": "40"}, held: map[string]string{"1/ETH": "0"},
			journal: []string{"p1:withdrawal:-30", "p2:withdrawal:-30"}, notifications: []string{"withdrawal_posted:p1:70/40", "withdrawal_posted:p2:40"},
			resolved: []ledger.HoldResolution{{HoldID: "h0", Status: payment.HoldPosted, By: "p1"}, {HoldID: "h1", Status: payment.HoldPosted, By: "p2"}}},
	},
	{
		name:     "a transfer before the transaction's first log is no evidence: nothing to claim",
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h0", tx: txA}},
		chain:    map[string]*ledger.ChainEvidence{"p1": chainOf(blockA, 5, "4")},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		holds: openHold("h0", 1, "30", payment.HoldOpen),
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeDuplicateTransfer},
			balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"}},
	},
	{
		name:     "post of a posted hold is hold_closed",
		events:   []ev{{id: "p2", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h0"}},
		balances: map[string]string{"1/ETH": "70"}, holds: openHold("h0", 1, "30", payment.HoldPosted),
		want: want{outcomes: map[string]payment.Outcome{"p2": payment.OutcomeHoldClosed}, balances: map[string]string{"1/ETH": "70"}},
	},
	{
		name:     "void of a voided hold is hold_closed",
		events:   []ev{{id: "v2", typ: payment.WithdrawalVoid, user: 1, amount: "30", hold: "h0"}},
		balances: map[string]string{"1/ETH": "70"}, holds: openHold("h0", 1, "30", payment.HoldVoided),
		want: want{outcomes: map[string]payment.Outcome{"v2": payment.OutcomeHoldClosed}, balances: map[string]string{"1/ETH": "70"}},
	},
	{
		name:     "post of an unknown hold is unknown_hold",
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "nowhere"}},
		balances: map[string]string{"1/ETH": "100"},
		want:     want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeUnknownHold}, balances: map[string]string{"1/ETH": "100"}},
	},
	{
		name:     "void of an unknown hold is unknown_hold",
		events:   []ev{{id: "v1", typ: payment.WithdrawalVoid, user: 1, amount: "30", hold: "nowhere"}},
		balances: map[string]string{"1/ETH": "100"},
		want:     want{outcomes: map[string]payment.Outcome{"v1": payment.OutcomeUnknownHold}, balances: map[string]string{"1/ETH": "100"}},
	},
	{
		name:     "post of another user's hold is unknown_hold",
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 2, amount: "30", hold: "h0"}},
		balances: map[string]string{"1/ETH": "100", "2/ETH": "0"}, held: map[string]string{"1/ETH": "30"},
		holds: openHold("h0", 1, "30", payment.HoldOpen),
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeUnknownHold}, balances: map[string]string{"1/ETH": "100", "2/ETH": "0"},
			held: map[string]string{"1/ETH": "30"}},
	},
	{
		name:     "post of another user's closed hold is unknown_hold too",
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 2, amount: "30", hold: "h0"}},
		balances: map[string]string{"2/ETH": "0"}, holds: openHold("h0", 1, "30", payment.HoldPosted),
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeUnknownHold}, balances: map[string]string{"2/ETH": "0"}},
	},
	{
		name:     "post naming another amount is mismatch",
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "29", hold: "h0"}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		holds: openHold("h0", 1, "30", payment.HoldOpen),
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeMismatch}, balances: map[string]string{"1/ETH": "100"},
			held: map[string]string{"1/ETH": "30"}},
	},
	{
		name:     "post on another network than its hold's is mismatch: the hold stays open",
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h0", on: "BASE_MAINNET"}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		holds: openHold("h0", 1, "30", payment.HoldOpen),
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeMismatch}, balances: map[string]string{"1/ETH": "100"},
			held: map[string]string{"1/ETH": "30"}},
	},
	{
		name:     "void on another network than its hold's still releases it: it pays nothing out",
		events:   []ev{{id: "v1", typ: payment.WithdrawalVoid, user: 1, amount: "30", hold: "h0", on: "BASE_MAINNET"}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		holds: openHold("h0", 1, "30", payment.HoldOpen),
		want: want{outcomes: map[string]payment.Outcome{"v1": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "0"},
			notifications: []string{"hold_voided:v1:100"}, resolved: []ledger.HoldResolution{{HoldID: "h0", Status: payment.HoldVoided, By: "v1"}}},
	},
	{
		name: "hold and post in one batch on other networks: the hold opens, the post is mismatch",
		events: []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "25", on: "BASE_MAINNET"},
			{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "25", hold: "h1"}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"h1": payment.OutcomeHeld, "p1": payment.OutcomeMismatch},
			balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "25"}, opened: []string{"h1"}},
	},
	{
		name:     "post accepted while its hold id named no hold (amount zero) is unknown for good",
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "0", hold: "h0"}},
		balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "30"},
		holds: openHold("h0", 1, "30", payment.HoldOpen),
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeUnknownHold}, balances: map[string]string{"1/ETH": "100"},
			held: map[string]string{"1/ETH": "30"}},
	},
	{
		name:     "post of a hold refused for insufficient funds is unknown_hold",
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h9"}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h9": payment.StatusFailed},
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeUnknownHold}, balances: map[string]string{"1/ETH": "100"}},
	},
	{
		name: "post of a hold not yet settled waits; the rest of the batch commits",
		events: []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h9"},
			{id: "dep", typ: payment.Deposit, user: 1, amount: "1"}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h9": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"p1": "", "dep": payment.OutcomeSuccess}, balances: map[string]string{"1/ETH": "101"},
			journal: []string{"dep:deposit:1"}, notifications: []string{"deposit_credited:dep:101"}},
	},
	{
		name: "hold and its post in one batch",
		events: []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "25"},
			{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "25", hold: "h1"}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"h1": payment.OutcomeHeld, "p1": payment.OutcomeSuccess},
			balances: map[string]string{"1/ETH": "75"}, held: map[string]string{"1/ETH": "0"},
			journal: []string{"p1:withdrawal:-25"}, notifications: []string{"withdrawal_posted:p1:75"}, opened: []string{"h1"},
			resolved: []ledger.HoldResolution{{HoldID: "h1", Status: payment.HoldPosted, By: "p1"}}},
	},
	{
		name: "a hold refused leaves its post in the same batch unknown_hold, without waiting",
		events: []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "200"},
			{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "200", hold: "h1"}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"h1": payment.OutcomeInsufficientFunds, "p1": payment.OutcomeUnknownHold},
			balances: map[string]string{"1/ETH": "100"}, notifications: []string{"insufficient_funds:h1:100"}},
	},

	// Holds pulled in: a post or void whose hold event waits unapplied in
	// the queue applies it first instead of waiting for it.
	{
		name:     "a post that overtook its hold applies the pulled hold first",
		pulled:   []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "25", at: 1}},
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "25", hold: "h1", at: 2}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeSuccess}, pulled: map[string]payment.Outcome{"h1": payment.OutcomeHeld},
			balances: map[string]string{"1/ETH": "75"}, held: map[string]string{"1/ETH": "0"},
			journal: []string{"p1:withdrawal:-25"}, notifications: []string{"withdrawal_posted:p1:75"}, opened: []string{"h1"},
			resolved: []ledger.HoldResolution{{HoldID: "h1", Status: payment.HoldPosted, By: "p1"}}},
	},
	{
		name:     "a void that overtook its hold applies the pulled hold, then releases it",
		pulled:   []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "25", at: 1}},
		events:   []ev{{id: "v1", typ: payment.WithdrawalVoid, user: 1, amount: "25", hold: "h1", at: 2}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"v1": payment.OutcomeSuccess}, pulled: map[string]payment.Outcome{"h1": payment.OutcomeHeld},
			balances: map[string]string{"1/ETH": "100"}, held: map[string]string{"1/ETH": "0"},
			notifications: []string{"hold_voided:v1:100"}, opened: []string{"h1"},
			resolved: []ledger.HoldResolution{{HoldID: "h1", Status: payment.HoldVoided, By: "v1"}}},
	},
	{
		name:     "a pulled hold refused for insufficient funds leaves its post unknown_hold",
		pulled:   []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "200", at: 1}},
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "200", hold: "h1", at: 2}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeUnknownHold}, pulled: map[string]payment.Outcome{"h1": payment.OutcomeInsufficientFunds},
			balances: map[string]string{"1/ETH": "100"}, notifications: []string{"insufficient_funds:h1:100"}},
	},
	{
		name: "a pulled hold takes its turn: an earlier withdrawal is served first",
		events: []ev{{id: "w", typ: payment.Withdrawal, user: 1, amount: "80", at: 1},
			{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h1", at: 3}},
		pulled:   []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "30", at: 2}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"w": payment.OutcomeSuccess, "p1": payment.OutcomeUnknownHold},
			pulled:   map[string]payment.Outcome{"h1": payment.OutcomeInsufficientFunds},
			balances: map[string]string{"1/ETH": "20"}, journal: []string{"w:withdrawal:-80"},
			notifications: []string{"withdrawal_confirmed:w:20", "insufficient_funds:h1:20"}},
	},
	{
		name: "a pulled hold takes its turn: a later withdrawal meets it",
		events: []ev{{id: "w", typ: payment.Withdrawal, user: 1, amount: "80", at: 2},
			{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "30", hold: "h1", at: 3}},
		pulled:   []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "30", at: 1}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"w": payment.OutcomeInsufficientFunds, "p1": payment.OutcomeSuccess},
			pulled:   map[string]payment.Outcome{"h1": payment.OutcomeHeld},
			balances: map[string]string{"1/ETH": "70"}, held: map[string]string{"1/ETH": "0"}, journal: []string{"p1:withdrawal:-30"},
			notifications: []string{"insufficient_funds:w:100/70", "withdrawal_posted:p1:70"}, opened: []string{"h1"},
			resolved: []ledger.HoldResolution{{HoldID: "h1", Status: payment.HoldPosted, By: "p1"}}},
	},
	{
		name:     "a pulled hold accepted in the same instant as its post, sorting after it, is still applied first",
		pulled:   []ev{{id: "z-hold", typ: payment.WithdrawalHold, user: 1, amount: "25", at: 1}},
		events:   []ev{{id: "a-post", typ: payment.WithdrawalPost, user: 1, amount: "25", hold: "z-hold", at: 1}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"z-hold": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"a-post": payment.OutcomeSuccess}, pulled: map[string]payment.Outcome{"z-hold": payment.OutcomeHeld},
			balances: map[string]string{"1/ETH": "75"}, held: map[string]string{"1/ETH": "0"},
			journal: []string{"a-post:withdrawal:-25"}, notifications: []string{"withdrawal_posted:a-post:75"}, opened: []string{"z-hold"},
			resolved: []ledger.HoldResolution{{HoldID: "z-hold", Status: payment.HoldPosted, By: "a-post"}}},
	},
	{
		name:   "a post and a void of one pulled hold: the later finds it closed",
		pulled: []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "25", at: 1}},
		events: []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "25", hold: "h1", at: 2},
			{id: "v1", typ: payment.WithdrawalVoid, user: 1, amount: "25", hold: "h1", at: 3}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"p1": payment.OutcomeSuccess, "v1": payment.OutcomeHoldClosed},
			pulled:   map[string]payment.Outcome{"h1": payment.OutcomeHeld},
			balances: map[string]string{"1/ETH": "75"}, held: map[string]string{"1/ETH": "0"},
			journal: []string{"p1:withdrawal:-25"}, notifications: []string{"withdrawal_posted:p1:75"}, opened: []string{"h1"},
			resolved: []ledger.HoldResolution{{HoldID: "h1", Status: payment.HoldPosted, By: "p1"}}},
	},
	{
		name:   "another user's post of a pulled hold is unknown_hold; the owner's posts it",
		pulled: []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "25", at: 1}},
		events: []ev{{id: "p-other", typ: payment.WithdrawalPost, user: 2, amount: "25", hold: "h1", at: 2},
			{id: "p-owner", typ: payment.WithdrawalPost, user: 1, amount: "25", hold: "h1", at: 3}},
		balances: map[string]string{"1/ETH": "100", "2/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"p-other": payment.OutcomeUnknownHold, "p-owner": payment.OutcomeSuccess},
			pulled:   map[string]payment.Outcome{"h1": payment.OutcomeHeld},
			balances: map[string]string{"1/ETH": "75"}, held: map[string]string{"1/ETH": "0"},
			journal: []string{"p-owner:withdrawal:-25"}, notifications: []string{"withdrawal_posted:p-owner:75"}, opened: []string{"h1"},
			resolved: []ledger.HoldResolution{{HoldID: "h1", Status: payment.HoldPosted, By: "p-owner"}}},
	},
	{
		name:     "a pulled hold of an account the batch did not lock is left to its task; the post waits",
		pulled:   []ev{{id: "h1", typ: payment.WithdrawalHold, user: 2, amount: "25", at: 1}},
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "25", hold: "h1", at: 2}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"p1": ""}, balances: map[string]string{"1/ETH": "100"}},
	},
	{
		name:     "a pulled hold whose idempotency record exists is left to its task; the post waits",
		pulled:   []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "25", at: 1}},
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "25", hold: "h1", at: 2}},
		replays:  map[string]payment.Outcome{"h1": payment.OutcomeDeadLettered},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"p1": ""}, balances: map[string]string{"1/ETH": "100"}},
	},
	{
		name:   "a hold both pulled and carried by a task of the batch is applied once",
		pulled: []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "25", at: 1}},
		events: []ev{{id: "h1", typ: payment.WithdrawalHold, user: 1, amount: "25", at: 1},
			{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "25", hold: "h1", at: 2}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"h1": payment.OutcomeHeld, "p1": payment.OutcomeSuccess},
			balances: map[string]string{"1/ETH": "75"}, held: map[string]string{"1/ETH": "0"},
			journal: []string{"p1:withdrawal:-25"}, notifications: []string{"withdrawal_posted:p1:75"}, opened: []string{"h1"},
			resolved: []ledger.HoldResolution{{HoldID: "h1", Status: payment.HoldPosted, By: "p1"}}},
	},
	{
		name:     "a pulled event that is not a hold is never applied",
		pulled:   []ev{{id: "h1", typ: payment.Withdrawal, user: 1, amount: "25", at: 1}},
		events:   []ev{{id: "p1", typ: payment.WithdrawalPost, user: 1, amount: "25", hold: "h1", at: 2}},
		balances: map[string]string{"1/ETH": "100"}, holdEvents: map[string]payment.Status{"h1": payment.StatusEnqueued},
		want: want{outcomes: map[string]payment.Outcome{"p1": ""}, balances: map[string]string{"1/ETH": "100"}},
	},
}

func TestPlan(t *testing.T) {
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			events := claimed(r.events)
			s := ledger.Snapshot{
				Events: events, Chain: map[int]*ledger.ChainEvidence{}, Replays: map[string]payment.Outcome{},
				Balances: accounts(r.balances), Held: accounts(r.held), Claims: r.claims, Payouts: r.payouts, Holds: r.holds, HoldEvents: r.holdEvents,
				Pulled: pulledOf(r.pulled),
			}
			for _, c := range events {
				s.Chain[c.Item] = r.chain[c.Event.ID]
				if o, ok := r.replays[c.Event.ID]; ok {
					s.Replays[c.Key] = o
				}
			}
			for _, c := range s.Pulled {
				if o, ok := r.replays[c.Event.ID]; ok {
					s.Replays[c.Key] = o
				}
			}
			before := snapshotText(s)
			w := ledger.Plan(s)
			require.Equal(t, before, snapshotText(s), "Plan changes nothing it was given")
			got := observe(t, events, s, w)
			require.Equal(t, r.want.outcomes, got.outcomes, "outcomes")
			require.Equal(t, filled(r.want.balances, r.balances), got.balances, "balances after")
			require.Equal(t, filled(r.want.held, r.held), got.held, "held after")
			require.Equal(t, r.want.journal, got.journal, "journal")
			require.Equal(t, r.want.notifications, got.notifications, "notifications")
			require.Equal(t, r.want.claims, got.claims, "new claims")
			require.Equal(t, r.want.moved, got.moved, "moved claims")
			require.Equal(t, r.want.payouts, got.payouts, "payout claims")
			require.Equal(t, r.want.opened, got.opened, "holds opened")
			require.Equal(t, r.want.resolved, w.Resolutions, "holds resolved")
			require.Equal(t, r.want.deadLetters, got.deadLetters, "dead letters")
			require.Equal(t, r.want.alerts, got.alerts, "alerts")
			require.Equal(t, r.want.rollback, got.rollback, "rolled back for")
			require.Equal(t, r.want.reopened, got.reopened, "reopened keys")
			require.Equal(t, r.want.pulled, got.pulled, "pulled holds applied")
		})
	}
}

// pulledOf is a row's pulled hold events as the storage hands them over:
// no item of the batch asked for them.
func pulledOf(events []ev) []ledger.Claimed {
	out := claimed(events)
	for i := range out {
		out[i].Item = -1
	}
	return out
}

// filled is the want of every account of the row: those not named did
// not change.
func filled(want, before map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range before {
		out[k] = d(v).String()
	}
	for k, v := range want {
		out[k] = d(v).String()
	}
	return out
}

type observed struct {
	outcomes                                               map[string]payment.Outcome
	balances, held                                         map[string]string
	journal, notifications, claims, moved, opened, payouts []string
	deadLetters, alerts, rollback, reopened                []string
	pulled                                                 map[string]payment.Outcome
}

// observe reads w back into a row's terms, and checks what holds of every
// plan: the journal and the deltas agree and sum to the balances after;
// no balance goes negative or below its holds; every applied event leaves
// one confirm or one fail and one recorded outcome.
func observe(t *testing.T, events []ledger.Claimed, s ledger.Snapshot, w *ledger.Writes) observed {
	t.Helper()
	o := observed{outcomes: map[string]payment.Outcome{}, balances: map[string]string{}, held: map[string]string{}}
	byItem := map[int]ledger.Claimed{}
	for _, c := range events {
		byItem[c.Item] = c
	}
	name := func(k ledger.Account) string { return fmt.Sprintf("%d/%s", k.User, k.Asset) }

	journaled := map[ledger.Account]decimal.Decimal{}
	for _, j := range w.Journal {
		k := ledger.Account{User: j.User, Asset: j.Asset}
		journaled[k] = journaled[k].Add(j.Amount)
		require.Equal(t, network, j.Network, "the journal records the event's network")
		o.journal = append(o.journal, fmt.Sprintf("%s:%s:%s", j.Source, j.EventType, j.Amount))
	}
	require.Equal(t, len(journaled), len(w.Deltas), "one delta per journaled account")
	for k, sum := range journaled {
		require.True(t, sum.Equal(w.Deltas[k]), "delta of %s is its journal rows' sum", name(k))
	}
	for k, after := range w.Balances {
		require.True(t, after.Equal(s.Balances[k].Add(w.Deltas[k])), "balance of %s after is before + delta", name(k))
		held := w.Held[k]
		require.True(t, held.Equal(s.Held[k].Add(w.HeldDeltas[k])), "held of %s after is before + delta", name(k))
		require.False(t, after.IsNegative(), "balance of %s negative", name(k))
		require.False(t, held.IsNegative(), "held of %s negative", name(k))
		require.False(t, held.GreaterThan(after), "held of %s past its balance", name(k))
		o.balances[name(k)] = after.String()
	}
	for k, held := range w.Held {
		o.held[name(k)] = held.String()
	}

	confirms, fails := map[string]ledger.Confirm{}, map[string]ledger.Fail{}
	for _, c := range w.Confirms {
		_, twice := confirms[c.ID]
		require.False(t, twice, "confirmed twice: %s", c.ID)
		require.True(t, c.Outcome.Confirms(), c.ID)
		confirms[c.ID] = c
	}
	for _, f := range w.Fails {
		_, twice := fails[f.ID]
		require.False(t, twice, "failed twice: %s", f.ID)
		fails[f.ID] = f
	}
	for item, res := range w.Results {
		c := byItem[item]
		id := c.Event.ID
		if res.Kind == ledger.Retry {
			require.ErrorIs(t, res.Err, payment.ErrUnavailable, "waiting spends no retry budget")
			require.Equal(t, payment.StatusEnqueued, res.Status)
			require.NotContains(t, confirms, id)
			require.NotContains(t, fails, id)
			require.NotContains(t, w.Outcomes, c.Key, "a waiting item records nothing")
			o.outcomes[id] = ""
			continue
		}
		require.Equal(t, ledger.Applied, res.Kind, id)
		require.Equal(t, c.Event, res.Event, id)
		o.outcomes[id] = res.Outcome
		switch res.Status {
		case payment.StatusConfirmed:
			require.Equal(t, res.Outcome, confirms[id].Outcome, id)
			require.NotContains(t, fails, id)
		case payment.StatusFailed:
			require.Equal(t, res.Outcome, fails[id].Outcome, id)
			require.NotContains(t, confirms, id)
		default:
			t.Fatalf("%s: status %s", id, res.Status)
		}
		if _, replayed := s.Replays[c.Key]; replayed && !w.Reopened[c.Key] {
			require.NotContains(t, w.Outcomes, c.Key, "a replay records its outcome again")
		} else {
			require.Equal(t, res.Outcome, w.Outcomes[c.Key], "recorded outcome of %s", id)
			require.Equal(t, id, w.KeyEvents[c.Key])
		}
		if res.Alert != "" {
			o.alerts = append(o.alerts, id)
		}
	}
	for id, res := range w.PulledResults {
		var c ledger.Claimed
		for _, p := range s.Pulled {
			if p.Event.ID == id {
				c = p
			}
		}
		require.Equal(t, id, c.Event.ID, "a pulled result is of a pulled event")
		require.Equal(t, ledger.Applied, res.Kind, id)
		require.Equal(t, c.Event, res.Event, id)
		switch res.Status {
		case payment.StatusConfirmed:
			require.Equal(t, res.Outcome, confirms[id].Outcome, id)
		case payment.StatusFailed:
			require.Equal(t, res.Outcome, fails[id].Outcome, id)
		default:
			t.Fatalf("%s: status %s", id, res.Status)
		}
		require.Equal(t, res.Outcome, w.Outcomes[c.Key], "recorded outcome of %s", id)
		require.Equal(t, id, w.KeyEvents[c.Key])
		if o.pulled == nil {
			o.pulled = map[string]payment.Outcome{}
		}
		o.pulled[id] = res.Outcome
	}
	for _, p := range s.Pulled {
		carried := slices.ContainsFunc(s.Events, func(c ledger.Claimed) bool { return c.Event.ID == p.Event.ID })
		if _, applied := w.PulledResults[p.Event.ID]; !applied && !carried {
			require.NotContains(t, w.Outcomes, p.Key, "a pulled event left to its task records nothing")
			require.NotContains(t, confirms, p.Event.ID)
			require.NotContains(t, fails, p.Event.ID)
		}
	}
	require.Len(t, w.Outcomes, len(w.Confirms)+len(w.Fails)-replayedCount(events, s, w), "an outcome per decided event")

	for _, n := range w.Notifications {
		var payload map[string]any
		dec := json.NewDecoder(strings.NewReader(n.Payload))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&payload))
		// The text is the one a map gives (keys sorted), whatever builds it.
		sorted, err := json.Marshal(payload)
		require.NoError(t, err)
		require.Equal(t, string(sorted), n.Payload)
		require.Len(t, payload, 9, n.Payload)
		require.Equal(t, n.DeliveryID, payload["delivery_id"])
		require.Equal(t, n.Kind+":"+n.EventID, n.DeliveryID, "one delivery per kind and event")
		require.Equal(t, "trace-"+n.EventID, n.TraceID)
		// kind:event:balance, and /available when some of it is held.
		note := fmt.Sprintf("%s:%s:%s", n.Kind, n.EventID, payload["balance"])
		if payload["available"] != payload["balance"] {
			note += fmt.Sprintf("/%s", payload["available"])
		}
		o.notifications = append(o.notifications, note)
	}
	claim := func(c ledger.PlannedClaim) string {
		require.Equal(t, network, c.Tx.Network)
		s := c.Claim.EventID + "@" + c.Claim.Index
		if c.Claim.BlockHash != "" {
			s += fmt.Sprintf("/%s+%d", c.Claim.BlockHash, c.Claim.Position)
		} else {
			require.EqualValues(t, -1, c.Claim.Position, "a claim without its block has no position")
		}
		return s
	}
	for _, c := range w.NewClaims {
		o.claims = append(o.claims, claim(c))
	}
	for _, c := range w.MovedClaims {
		o.moved = append(o.moved, claim(c))
	}
	for _, c := range w.NewPayouts {
		require.Equal(t, network, c.Tx.Network)
		o.payouts = append(o.payouts, fmt.Sprintf("%s@%s=%s/%s", c.Claim.EventID, c.Claim.Transfer, c.Claim.Index, c.Claim.BlockHash))
	}
	holdNetworks := map[string]string{}
	for _, c := range append(slices.Clone(events), s.Pulled...) {
		holdNetworks[c.Event.ID] = c.HoldNetwork
	}
	for _, h := range w.OpenHolds {
		require.Equal(t, payment.HoldOpen, h.Status)
		require.Equal(t, holdNetworks[h.ID], h.Network, "a hold opens on its event's network")
		require.Equal(t, "0xto", h.ToAddress)
		o.opened = append(o.opened, h.ID)
	}
	require.Len(t, w.DeadLetterItems, len(w.DeadLetters))
	for i, dl := range w.DeadLetters {
		require.Equal(t, payment.SourceLedger, dl.Source)
		require.Equal(t, dl.EventID, byItem[w.DeadLetterItems[i]].Event.ID)
		require.Equal(t, dl.Error, fails[dl.EventID].Err)
		o.deadLetters = append(o.deadLetters, dl.EventID)
	}
	for item, err := range w.Retry {
		require.ErrorIs(t, err, payment.ErrRetryable)
		require.NotContains(t, w.Results, item)
		o.rollback = append(o.rollback, byItem[item].Event.ID)
	}
	for _, c := range events {
		if w.Reopened[c.Key] {
			o.reopened = append(o.reopened, c.Event.ID)
		}
	}
	slices.Sort(o.rollback)
	return o
}

func replayedCount(events []ledger.Claimed, s ledger.Snapshot, w *ledger.Writes) int {
	n := 0
	for _, c := range events {
		if _, ok := s.Replays[c.Key]; ok && !w.Reopened[c.Key] {
			if _, decided := w.Results[c.Item]; decided {
				n++
			}
		}
	}
	return n
}

// snapshotText renders what Plan was given, to show it unchanged.
func snapshotText(s ledger.Snapshot) string {
	var b strings.Builder
	for _, c := range s.Events {
		fmt.Fprintf(&b, "%s %d|", c.Event.ID, c.Item)
	}
	for _, c := range s.Pulled {
		fmt.Fprintf(&b, "pulled %s %d %v|", c.Event.ID, c.Item, c.Pulled)
	}
	fmt.Fprintf(&b, "%v|", s.HoldEvents)
	txs := slices.SortedFunc(maps.Keys(s.Claims), func(a, b ledger.Tx) int { return strings.Compare(a.Network+a.TxHash, b.Network+b.TxHash) })
	for _, k := range txs {
		fmt.Fprintf(&b, "%v=%v|", k, s.Claims[k])
	}
	payoutTxs := slices.SortedFunc(maps.Keys(s.Payouts), func(a, b ledger.Tx) int { return strings.Compare(a.Network+a.TxHash, b.Network+b.TxHash) })
	for _, k := range payoutTxs {
		fmt.Fprintf(&b, "payouts %v=%v|", k, s.Payouts[k])
	}
	for _, id := range slices.Sorted(maps.Keys(s.Holds)) {
		fmt.Fprintf(&b, "%s=%+v|", id, *s.Holds[id])
	}
	fmt.Fprintf(&b, "%v|%v", s.Balances, s.Held)
	return b.String()
}

// TestConfirmsCarryTheChainEvidence: a credited deposit hands its block
// to the reorg watcher; a post records the block of its payment out (the
// watcher follows it too when it is not final); a debit has none.
func TestConfirmsCarryTheChainEvidence(t *testing.T) {
	events := claimed([]ev{
		{id: "dep", typ: payment.Deposit, user: 1, amount: "1", tx: txA},
		{id: "post", typ: payment.WithdrawalPost, user: 1, amount: "2", hold: "h0"},
		{id: "w", typ: payment.Withdrawal, user: 1, amount: "1"},
	})
	deposit := &ledger.ChainEvidence{BlockNumber: 5, BlockHash: blockA, Watch: true, Transfers: []string{payment.TransferNative}}
	payout := &ledger.ChainEvidence{BlockNumber: 6, BlockHash: blockB}
	w := ledger.Plan(ledger.Snapshot{
		Events:   events,
		Chain:    map[int]*ledger.ChainEvidence{0: deposit, 1: payout},
		Balances: accounts(map[string]string{"1/ETH": "10"}), Held: accounts(map[string]string{"1/ETH": "2"}),
		Holds: openHold("h0", 1, "2", payment.HoldOpen),
	})
	got := map[string]ledger.Confirm{}
	for _, c := range w.Confirms {
		got[c.ID] = c
	}
	require.Equal(t, ledger.Confirm{ID: "dep", Chain: deposit, Outcome: payment.OutcomeSuccess}, got["dep"])
	require.Equal(t, ledger.Confirm{ID: "post", Chain: payout, Outcome: payment.OutcomeSuccess}, got["post"])
	require.Equal(t, ledger.Confirm{ID: "w", Outcome: payment.OutcomeSuccess}, got["w"])
	require.Equal(t, "8", w.Balances[acct("1/ETH")].String(), "10 + 1 - 2 - 1")
}
