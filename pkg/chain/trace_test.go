//go:build !fuzzing

package chain

import (
	"context"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/chain/devchain"
	"github.com/settle/settle/pkg/payment"
)

// TestInternalTransfers: the dev chain's forwarder moves ETH by contract
// call; the trace scan finds the direct and the nested forward and not
// the one whose frame reverted, and names each frame as the node's own
// Parity-style tracer (flatCallTracer, what Alchemy's trace addresses
// follow) does, a call to a precompile before it taking no index.
func TestInternalTransfers(t *testing.T) {
	ctx := testContext(t)
	ch := startChain(t)
	client, err := Dial(ctx, ch.URL(), ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	forwarder, _, err := ch.DeployForwarder(ctx, 0)
	require.NoError(t, err)
	const to = "0x3333333333333333333333333333333333333333"
	direct, err := ch.SendForward(ctx, 0, forwarder, to, big.NewInt(5), devchain.ForwardDirect)
	require.NoError(t, err)
	reverted, err := ch.SendForward(ctx, 0, forwarder, to, big.NewInt(11), devchain.ForwardReverted)
	require.NoError(t, err)
	nested, err := ch.SendForward(ctx, 0, forwarder, to, big.NewInt(7), devchain.ForwardNested)
	require.NoError(t, err)
	for _, tx := range []devchain.Tx{direct, reverted, nested} {
		require.Equal(t, uint64(1), tx.Status, "every forward transaction succeeds")
	}
	var balance string
	require.NoError(t, client.rpc.CallContext(ctx, &balance, "eth_getBalance", to, "latest"))
	require.NoError(t, client.ProbeTraces(ctx, true), "past genesis, which no node traces")
	require.NoError(t, client.ProbeTxTraces(ctx), "no such transaction: the method is there")
	require.Equal(t, "0xc", balance, "5 direct and 7 nested reached the recipient; the reverted 11 did not")

	all, err := client.InternalTransfers(ctx, []uint64{direct.BlockNumber, reverted.BlockNumber, nested.BlockNumber})
	require.NoError(t, err)
	var got []InternalTransfer
	for _, tr := range all {
		if tr.To == to { // the nested forward's first call, to the forwarder itself, is one too
			got = append(got, tr)
		}
	}
	require.Len(t, all, 3)
	require.Equal(t, []InternalTransfer{
		{TxHash: direct.Hash, BlockNumber: direct.BlockNumber, To: to, Value: big.NewInt(5), TraceAddress: "CALL_0"},
		{TxHash: nested.Hash, BlockNumber: nested.BlockNumber, To: to, Value: big.NewInt(7), TraceAddress: "CALL_0_0"},
	}, got)
	require.Equal(t, "trace:call_0_0", got[1].Index(), "Alchemy's spelling, so both make one event")

	for _, tr := range got {
		var flat []struct {
			TxHash string `json:"txHash"`
			Result []struct {
				TraceAddress []int `json:"traceAddress"`
				Action       struct {
					CallType string `json:"callType"`
					To       string `json:"to"`
				} `json:"action"`
			} `json:"result"`
		}
		require.NoError(t, client.rpc.CallContext(ctx, &flat, MethodTraceBlock, fmt.Sprintf("0x%x", tr.BlockNumber), map[string]any{"tracer": "flatCallTracer"}))
		var names []string
		for _, tx := range flat {
			for _, f := range tx.Result {
				if tx.TxHash == tr.TxHash && strings.EqualFold(f.Action.To, tr.To) && len(f.TraceAddress) > 0 {
					name := strings.ToUpper(f.Action.CallType)
					for _, i := range f.TraceAddress {
						name += fmt.Sprintf("_%d", i)
					}
					names = append(names, name)
				}
			}
		}
		require.Equal(t, []string{tr.TraceAddress}, names, "the node's Parity-style trace names the frame alike")
	}

	_, err = client.InternalTransfers(ctx, make([]uint64, TraceBatchMax+1))
	require.Error(t, err)

	// By hash: the same transfers, each naming the block traced; a hash
	// the node has no block for (another branch's) is an error, never the
	// trace of the block it has at that height.
	at := []BlockID{{Number: direct.BlockNumber, Hash: direct.BlockHash}, {Number: nested.BlockNumber, Hash: nested.BlockHash}}
	byHash, err := client.InternalTransfersAt(ctx, at)
	require.NoError(t, err)
	var gotAt []InternalTransfer
	for _, tr := range byHash {
		if tr.To == to {
			gotAt = append(gotAt, tr)
		}
	}
	require.Equal(t, []InternalTransfer{
		{TxHash: direct.Hash, BlockNumber: direct.BlockNumber, BlockHash: direct.BlockHash, To: to, Value: big.NewInt(5), TraceAddress: "CALL_0"},
		{TxHash: nested.Hash, BlockNumber: nested.BlockNumber, BlockHash: nested.BlockHash, To: to, Value: big.NewInt(7), TraceAddress: "CALL_0_0"},
	}, gotAt)
	_, err = client.InternalTransfersAt(ctx, []BlockID{{Number: direct.BlockNumber, Hash: "0x" + strings.Repeat("ab", 32)}})
	require.ErrorIs(t, err, payment.ErrUnavailable, "no such block")
}

// TestTracesUnsupported: a node without the debug API is told apart from
// an outage, by the probe and by the scan call.
func TestTracesUnsupported(t *testing.T) {
	ctx := testContext(t)
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true, NoTraces: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	client, err := Dial(ctx, ch.URL(), ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	require.ErrorIs(t, client.ProbeTraces(ctx, true), ErrTracesUnsupported)
	require.ErrorIs(t, client.ProbeTxTraces(ctx), ErrTxTraceUnsupported)
	_, err = client.InternalTransfers(ctx, []uint64{0})
	require.ErrorIs(t, err, ErrTracesUnsupported)
	_, err = client.InternalTransfersAt(ctx, []BlockID{{Number: 1, Hash: "0x" + strings.Repeat("ab", 32)}})
	require.ErrorIs(t, err, ErrTracesUnsupported)
}

// ownerOf is an AddressOwner that owns the addresses listed.
type ownerOf []string

func (o ownerOf) Owned(_ context.Context, addresses []string) ([]string, error) {
	var out []string
	for _, a := range addresses {
		if slices.Contains(o, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// The forwarder's three sends to forwardTo: 5 wei by its call_0
// (direct), 7 by call_0_0 (nested), 11 by a call that is rolled back.
const (
	forwardTo    = "0x3333333333333333333333333333333333333333"
	forwardOther = "0x4444444444444444444444444444444444444444"
)

type forwards struct {
	forwarder                string
	direct, nested, reverted devchain.Tx
}

// newForwards starts a chain with a worker on it and makes the
// forwarder's three sends.
func newForwards(t *testing.T) (*worker, forwards) {
	ctx := testContext(t)
	ch := startChain(t)
	w := newWorker(t, ch.URL(), workerOptions{})
	var f forwards
	var err error
	f.forwarder, _, err = ch.DeployForwarder(ctx, 0)
	require.NoError(t, err)
	for _, send := range []struct {
		tx     *devchain.Tx
		amount int64
		how    devchain.Forward
	}{{&f.direct, 5, devchain.ForwardDirect}, {&f.nested, 7, devchain.ForwardNested}, {&f.reverted, 11, devchain.ForwardReverted}} {
		*send.tx, err = ch.SendForward(ctx, 0, f.forwarder, forwardTo, big.NewInt(send.amount), send.how)
		require.NoError(t, err)
	}
	return w, f
}

// TestInternalDeposits: an internal deposit is held against the
// transaction's call trace, numbered as the scan numbers it. The frame it
// names must be a CALL, not rolled back (nor under a frame that was),
// paying the deposit's address (or one of the user's) exactly its amount;
// anything else is a Mismatch saying what the trace shows.
func TestInternalDeposits(t *testing.T) {
	ctx := testContext(t)
	w, f := newForwards(t)
	forwarder, direct, nested, reverted := f.forwarder, f.direct, f.nested, f.reverted
	const to, other = forwardTo, forwardOther
	internal := func(tx devchain.Tx, index string, amount int64, recipients ...string) Deposit {
		return Deposit{TxHash: tx.Hash, Internal: true, Index: index, Amount: big.NewInt(amount), Recipients: recipients}
	}
	policy := NonePolicy()

	v := check(t, w, internal(direct, "trace:CALL_0", 5, to), policy)
	require.Equal(t, Credit, v.State, v.Reason)
	require.Equal(t, []string{"trace:call_0"}, v.Transfers, "claimed in the one spelling every reporter derives")
	v = check(t, w, internal(nested, "trace:call_0_0", 7, to), policy)
	require.Equal(t, Credit, v.State, v.Reason)
	byOwner := internal(nested, "trace:call_0_0", 7)
	byOwner.Owner = ownerOf{other, to}
	require.Equal(t, Credit, check(t, w, byOwner, policy).State, "a registered address of the user")

	byStranger := internal(nested, "trace:call_0_0", 7)
	byStranger.Owner = ownerOf{other}
	for name, tc := range map[string]struct {
		d      Deposit
		reason string
	}{
		"wrong amount":    {internal(direct, "trace:call_0", 6, to), "the call at call_0 carries 5 base units, the deposit says 6"},
		"wrong recipient": {internal(direct, "trace:call_0", 5, other), "the call at call_0 pays " + to + ", not " + other},
		"not the user's":  {byStranger, "the call at call_0_0 pays " + to + ", which is not a deposit address of the user"},
		"a reverted frame": {internal(reverted, "trace:call_0", 11, forwarder),
			"the call at call_0 was rolled back (execution reverted): it moved nothing"},
		"under a reverted frame": {internal(reverted, "trace:call_0_0", 11, to),
			"the call at call_0_0 was rolled back (execution reverted): it moved nothing"},
		"no frame there":        {internal(direct, "trace:call_0_3", 5, to), "the transaction's call trace has no frame call_0_3"},
		"no call at all":        {internal(direct, "trace:call_1", 5, to), "the transaction's call trace has no frame call_1"},
		"the transaction's own": {internal(direct, "trace:call", 5, to), "transfer trace:call names no call inside the transaction"},
		"another call type":     {internal(direct, "trace:delegatecall_0", 5, to), "transfer trace:delegatecall_0 names a DELEGATECALL, which moves no ETH to its recipient"},
		"the native value":      {internal(nested, "trace:call_0", 7, to), "the call at call_0 pays " + forwarder + ", not " + to},
	} {
		t.Run(name, func(t *testing.T) {
			v := check(t, w, tc.d, policy)
			require.Equal(t, Mismatch, v.State)
			require.Equal(t, tc.reason, v.Reason)
			require.Empty(t, v.Transfers)
		})
	}

	// Mined again in another block, the transaction keeps its credit only
	// if the trace there still pays the deposit.
	gone, err := w.checker.StillCanonical(ctx, internal(direct, "trace:call_0", 6, to), direct.BlockNumber, nested.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Gone, gone.State, gone.Reason)
	moved, err := w.checker.StillCanonical(ctx, internal(direct, "trace:call_0", 5, to), direct.BlockNumber, nested.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Moved, moved.State, moved.Reason)

	// Status-only checking is the operator's explicit choice.
	statusOnly := NewChecker(w.client, CheckerOptions{InternalStatusOnly: true, NotFinalTTL: -1, Registerer: prometheus.NewRegistry()})
	v, err = statusOnly.CheckDeposit(ctx, internal(direct, "trace:call_0", 6, other), policy)
	require.NoError(t, err)
	require.Equal(t, Credit, v.State)
}

// TestInternalDepositWithoutDebugAPI: a node without debug_traceTransaction
// never lets an internal deposit through unchecked: the check answers
// ErrTxTraceUnsupported (an unavailability: the deposit waits), which is
// the node's answer, not an outage, so the breaker stays shut for every
// other deposit of the network.
func TestInternalDepositWithoutDebugAPI(t *testing.T) {
	ctx := testContext(t)
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true, NoTraces: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	w := newWorker(t, ch.URL(), workerOptions{})
	forwarder, _, err := ch.DeployForwarder(ctx, 0)
	require.NoError(t, err)
	const to = "0x3333333333333333333333333333333333333333"
	direct, err := ch.SendForward(ctx, 0, forwarder, to, big.NewInt(5), devchain.ForwardDirect)
	require.NoError(t, err)
	d := Deposit{TxHash: direct.Hash, Internal: true, Index: "trace:call_0", Amount: big.NewInt(5), Recipients: []string{to}}
	for range BreakerErrorsMaxDefault + 1 {
		_, err := w.checker.CheckDeposit(ctx, d, NonePolicy())
		require.ErrorIs(t, err, ErrTxTraceUnsupported)
		require.ErrorIs(t, err, payment.ErrUnavailable)
	}
	require.NoError(t, w.latest(ctx), "the breaker is shut: the node answered")
}

// TestNativeDepositPaidByACall: a native deposit naming no transfer that
// the transaction's own value does not pay (a smart wallet's send: the
// value goes to the wallet, a call inside pays the user) is credited from
// the trace when a frame pays one of its recipients exactly the amount:
// its candidates are those frames, named as providers name them. Anything
// else stays the own value's mismatch; a deposit naming "native" is not
// looked for elsewhere, nor is one under status-only checking.
func TestNativeDepositPaidByACall(t *testing.T) {
	ctx := testContext(t)
	w, f := newForwards(t)
	forwarder, direct, nested, reverted := f.forwarder, f.direct, f.nested, f.reverted
	const to, other = forwardTo, forwardOther
	native := func(tx devchain.Tx, amount int64, owner ...string) Deposit {
		return Deposit{TxHash: tx.Hash, Amount: big.NewInt(amount), Owner: ownerOf(owner)}
	}
	policy := NonePolicy()

	for name, tc := range map[string]struct {
		d    Deposit
		want []string
	}{
		"a call pays the user":         {native(direct, 5, other, to), []string{"trace:call_0"}},
		"a nested call pays the user":  {native(nested, 7, to), []string{"trace:call_0_0"}},
		"a named recipient":            {Deposit{TxHash: direct.Hash, Amount: big.NewInt(5), Recipients: []string{to}}, []string{"trace:call_0"}},
		"the value only: its own":      {Deposit{TxHash: direct.Hash, Amount: big.NewInt(5)}, []string{payment.TransferNative}},
		"the owner's own value stands": {native(direct, 5, forwarder), []string{payment.TransferNative}},
	} {
		t.Run(name, func(t *testing.T) {
			v := check(t, w, tc.d, policy)
			require.Equal(t, Credit, v.State, v.Reason)
			require.Equal(t, tc.want, v.Transfers)
		})
	}
	notTheUsers := "the transaction pays " + forwarder + ", which is not a deposit address of the user"
	namedNative := native(direct, 5, to)
	namedNative.Index = payment.TransferNative
	for name, tc := range map[string]struct {
		d      Deposit
		reason string
	}{
		"another amount":         {native(direct, 6, to), notTheUsers},
		"another user's address": {native(direct, 5, other), notTheUsers},
		"a rolled-back call":     {native(reverted, 11, to), notTheUsers},
		"named native":           {namedNative, notTheUsers},
	} {
		t.Run(name, func(t *testing.T) {
			v := check(t, w, tc.d, policy)
			require.Equal(t, Mismatch, v.State)
			require.Equal(t, tc.reason, v.Reason)
			require.Empty(t, v.Transfers)
		})
	}

	// Mined again elsewhere, it keeps its credit while a call still pays.
	moved, err := w.checker.StillCanonical(ctx, native(direct, 5, to), direct.BlockNumber, nested.BlockHash)
	require.NoError(t, err)
	require.Equal(t, Moved, moved.State, moved.Reason)

	statusOnly := NewChecker(w.client, CheckerOptions{InternalStatusOnly: true, NotFinalTTL: -1, Registerer: prometheus.NewRegistry()})
	v, err := statusOnly.CheckDeposit(ctx, native(direct, 5, to), policy)
	require.NoError(t, err)
	require.Equal(t, Mismatch, v.State, "status-only checking credits only what a trace index names")

	// A node without the debug API: the mismatch stands, and says why.
	bare, err := devchain.Serve(ctx, devchain.Options{Manual: true, NoTraces: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, bare.Close()) })
	wb := newWorker(t, bare.URL(), workerOptions{})
	fw, _, err := bare.DeployForwarder(ctx, 0)
	require.NoError(t, err)
	sent, err := bare.SendForward(ctx, 0, fw, to, big.NewInt(5), devchain.ForwardDirect)
	require.NoError(t, err)
	v = check(t, wb, native(sent, 5, to), policy)
	require.Equal(t, Mismatch, v.State)
	require.Contains(t, v.Reason, "not looked for: the endpoint does not serve debug_traceTransaction")
	require.NoError(t, wb.latest(ctx), "the breaker is shut: the node answered")
}
