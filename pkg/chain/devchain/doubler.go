package devchain

import (
	"context"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/vm"
)

// The doubler forwards its calldata to the token twice, so one call with
// transfer(to, value) calldata is one transaction with two Transfer logs
// identical but for their index: a deposit paid twice in one transaction.
// Hand assembled like the token.

const (
	// GasDoublerDeploy and GasDoublerCall are enough for the doubler.
	GasDoublerDeploy = 200_000
	GasDoublerCall   = 200_000
)

// DoublerInitcode deploys the doubler for token: copy the calldata to
// memory, CALL the token with it twice (ignoring the results: the token
// never fails a well-formed transfer), stop. Exported for callers that
// sign their own transactions (the chaos soak's).
func DoublerInitcode(token common.Address) []byte {
	call := []byte{
		byte(vm.PUSH1), 0, byte(vm.PUSH1), 0, // retSize, retOffset
		byte(vm.CALLDATASIZE), byte(vm.PUSH1), 0, // argsSize, argsOffset
		byte(vm.PUSH1), 0, // value
		byte(vm.PUSH20),
	}
	call = append(call, token.Bytes()...)
	call = append(call, byte(vm.GAS), byte(vm.CALL), byte(vm.POP))
	runtime := []byte{byte(vm.CALLDATASIZE), byte(vm.PUSH1), 0, byte(vm.PUSH1), 0, byte(vm.CALLDATACOPY)}
	runtime = append(runtime, call...)
	runtime = append(runtime, call...)
	runtime = append(runtime, byte(vm.STOP))
	const prefixLength = 12
	code := []byte{
		byte(vm.PUSH1), byte(len(runtime)), byte(vm.PUSH1), prefixLength, byte(vm.PUSH1), 0, byte(vm.CODECOPY),
		byte(vm.PUSH1), byte(len(runtime)), byte(vm.PUSH1), 0, byte(vm.RETURN),
	}
	return append(code, runtime...)
}

// TransferCalldata encodes transfer(to, value), as the token and the
// doubler take it.
func TransferCalldata(to common.Address, value *big.Int) []byte { return transferCalldata(to, value) }

// DeployDoubler deploys a doubler of token from account index from and
// returns its lowercase address.
func (c *Chain) DeployDoubler(ctx context.Context, from int, token string) (string, Tx, error) {
	contract, err := address(token)
	if err != nil {
		return "", Tx{}, err
	}
	return c.deploy(ctx, from, GasDoublerDeploy, DoublerInitcode(contract), "doubler")
}

// SendTwin pays to value twice in one transaction through the doubler,
// and waits until it is mined.
func (c *Chain) SendTwin(ctx context.Context, from int, doubler, to string, value *big.Int) (Tx, error) {
	contract, err := address(doubler)
	if err != nil {
		return Tx{}, err
	}
	recipient, err := address(to)
	if err != nil {
		return Tx{}, err
	}
	return c.send(ctx, from, &contract, new(big.Int), GasDoublerCall, transferCalldata(recipient, value))
}
