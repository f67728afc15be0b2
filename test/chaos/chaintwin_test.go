package chaos

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"

	"github.com/settle/settle/pkg/chain/devchain"
)

// A transaction with two identical Transfer logs to one address, through
// devchain's doubler. The soak signs these transactions itself, from a
// dev account no helper uses (devchain's own sends would race its nonces).
const (
	rawMinedWaitMax = 30 * time.Second
	rawMinedPoll    = 20 * time.Millisecond
	rawTipWei       = 1_000_000_000
	// twinPct of the token transfers are made through the doubler.
	twinPct = 15
)

// rawSender signs and sends transactions from one dev account.
type rawSender struct {
	eth    *ethclient.Client
	key    *ecdsa.PrivateKey
	from   common.Address
	signer types.Signer
	mu     sync.Mutex // one nonce at a time
}

func newRawSender(eth *ethclient.Client, acct devchain.Account) (*rawSender, error) {
	key, err := crypto.HexToECDSA(acct.PrivateKey)
	if err != nil {
		return nil, err
	}
	return &rawSender{eth: eth, key: key, from: common.HexToAddress(acct.Address), signer: types.LatestSignerForChainID(big.NewInt(devchain.ChainID))}, nil
}

// send submits a transaction and waits until it is mined.
func (s *rawSender) send(ctx context.Context, to *common.Address, data []byte, gas uint64) (*types.Receipt, error) {
	s.mu.Lock()
	hash, err := s.submit(ctx, to, data, gas)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, rawMinedWaitMax)
	defer cancel()
	for {
		receipt, err := s.eth.TransactionReceipt(ctx, hash)
		if err == nil {
			return receipt, nil
		}
		if !errors.Is(err, ethereum.NotFound) && !strings.Contains(err.Error(), "indexing is in progress") {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s not mined: %w", hash.Hex(), ctx.Err())
		case <-time.After(rawMinedPoll):
		}
	}
}

func (s *rawSender) submit(ctx context.Context, to *common.Address, data []byte, gas uint64) (common.Hash, error) {
	nonce, err := s.eth.PendingNonceAt(ctx, s.from)
	if err != nil {
		return common.Hash{}, err
	}
	head, err := s.eth.HeaderByNumber(ctx, nil)
	if err != nil {
		return common.Hash{}, err
	}
	tip := big.NewInt(rawTipWei)
	feeCap := new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), tip)
	tx, err := types.SignNewTx(s.key, s.signer, &types.DynamicFeeTx{
		ChainID: big.NewInt(devchain.ChainID), Nonce: nonce, To: to, Value: new(big.Int), Gas: gas,
		GasTipCap: tip, GasFeeCap: feeCap, Data: data,
	})
	if err != nil {
		return common.Hash{}, err
	}
	return tx.Hash(), s.eth.SendTransaction(ctx, tx)
}

// deployDoubler puts the doubler on the chain for the rig's token.
func (r *chainRig) deployDoubler(ctx context.Context) error {
	receipt, err := r.raw.send(ctx, nil, devchain.DoublerInitcode(common.HexToAddress(r.token)), devchain.GasDoublerDeploy)
	if err != nil {
		return err
	}
	if receipt.Status != types.ReceiptStatusSuccessful {
		return errors.New("doubler deployment reverted")
	}
	r.doubler = receipt.ContractAddress
	return nil
}

// sendTwin makes one transaction with two identical Transfer logs of
// value to to; it answers the transaction and the two log indices.
func (r *chainRig) sendTwin(ctx context.Context, to string, value *big.Int) (devchain.Tx, [2]uint, error) {
	receipt, err := r.raw.send(ctx, &r.doubler, devchain.TransferCalldata(common.HexToAddress(to), value), devchain.GasDoublerCall)
	if err != nil {
		return devchain.Tx{}, [2]uint{}, err
	}
	tx := devchain.Tx{Hash: strings.ToLower(receipt.TxHash.Hex()), BlockNumber: receipt.BlockNumber.Uint64(), BlockHash: strings.ToLower(receipt.BlockHash.Hex()), Status: receipt.Status}
	if receipt.Status != types.ReceiptStatusSuccessful || len(receipt.Logs) != 2 {
		return tx, [2]uint{}, fmt.Errorf("doubler transaction %s: status %d, %d logs", tx.Hash, receipt.Status, len(receipt.Logs))
	}
	return tx, [2]uint{receipt.Logs[0].Index, receipt.Logs[1].Index}, nil
}

// TestDoubler: one call through the doubler is one transaction with two
// Transfer logs identical but for their index.
func TestDoubler(t *testing.T) {
	ctx := context.Background()
	ch, err := devchain.Serve(ctx, devchain.Options{BlockInterval: 100 * time.Millisecond, Accounts: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	token, _, err := ch.DeployToken(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	eth, err := ethclient.DialContext(ctx, ch.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer eth.Close()
	r := &chainRig{chain: ch, eth: eth, token: strings.ToLower(token)}
	if r.raw, err = newRawSender(eth, ch.Accounts()[1]); err != nil {
		t.Fatal(err)
	}
	if err := r.deployDoubler(ctx); err != nil {
		t.Fatal(err)
	}
	const to = "0x1111111111111111111111111111111111111111"
	tx, logs, err := r.sendTwin(ctx, to, big.NewInt(1234))
	if err != nil {
		t.Fatal(err)
	}
	if logs[1] != logs[0]+1 {
		t.Fatalf("log indices %v", logs)
	}
	receipt, err := eth.TransactionReceipt(ctx, common.HexToHash(tx.Hash))
	if err != nil {
		t.Fatal(err)
	}
	a, b := receipt.Logs[0], receipt.Logs[1]
	if a.Address != b.Address || !strings.EqualFold(a.Address.Hex(), token) || len(a.Topics) != 3 || a.Topics[0] != b.Topics[0] || a.Topics[1] != b.Topics[1] || a.Topics[2] != b.Topics[2] ||
		!strings.EqualFold(common.BytesToAddress(a.Topics[2].Bytes()).Hex(), to) || new(big.Int).SetBytes(a.Data).Int64() != 1234 || string(a.Data) != string(b.Data) {
		t.Fatalf("logs differ or are wrong:\n%+v\n%+v", a, b)
	}
}

// TestRelocate: a fork re-mines the other transactions of the blocks it
// drops, and a token transfer re-mined in a block with other logs before
// it has another log index there. relocate finds each transfer where it
// is now (and keeps where it was first mined); the dropped one, and one
// the chain never carried, are not canonical.
func TestRelocate(t *testing.T) {
	ctx := context.Background()
	ch, err := devchain.Serve(ctx, devchain.Options{Manual: true, Accounts: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	token, _, err := ch.DeployToken(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	eth, err := ethclient.DialContext(ctx, ch.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer eth.Close()
	r := &chainRig{chain: ch, eth: eth, token: strings.ToLower(token)}
	for _, i := range []int{1, 2} {
		if tx, err := ch.TransferToken(ctx, 0, token, ch.Accounts()[i].Address, big.NewInt(1_000_000)); err != nil || tx.Status != 1 {
			t.Fatalf("fund account %d: %v %+v", i, err, tx)
		}
	}
	const to = "0x2222222222222222222222222222222222222222"
	var sent []*transfer
	for i, from := range []int{0, 1, 2} {
		tx, err := ch.TransferToken(ctx, from, token, to, big.NewInt(int64(100+i)))
		if err != nil || tx.Status != 1 {
			t.Fatalf("transfer %d: %v %+v", i, err, tx)
		}
		receipt, err := eth.TransactionReceipt(ctx, common.HexToHash(tx.Hash))
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, &transfer{to: to, token: r.token, asset: chainToken, base: big.NewInt(int64(100 + i)), hash: tx.Hash, block: tx.BlockNumber,
			index: fmt.Sprint(receipt.Logs[0].Index)})
	}
	if _, err := ch.Reorg(ctx, sent[0].hash); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.relocate(ctx, sent[:1]); ok || err != nil {
		t.Fatalf("the dropped transfer: canonical %v, %v", ok, err)
	}
	moved := 0
	for _, tr := range sent[1:] {
		if ok, err := r.relocate(ctx, []*transfer{tr}); !ok || err != nil {
			t.Fatalf("re-mined %s: canonical %v, %v", tr.hash, ok, err)
		}
		receipt, err := eth.TransactionReceipt(ctx, common.HexToHash(tr.hash))
		if err != nil || fmt.Sprint(receipt.Logs[0].Index) != tr.index {
			t.Fatalf("relocated to %s; the node says %v (%v)", tr.index, receipt, err)
		}
		if tr.index != tr.minedIndex {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no re-mined transfer changed its log index: the test shows nothing")
	}
	other := *sent[1]
	other.base, other.index, other.minedIndex = big.NewInt(999), "", ""
	if ok, err := r.relocate(ctx, []*transfer{&other}); ok || err != nil {
		t.Fatalf("a transfer the chain never carried: canonical %v, %v", ok, err)
	}
}
