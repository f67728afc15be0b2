package devchain

import (
	"context"
	"errors"
	"fmt"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/vm"
)

// The forwarder moves ETH by contract call, which neither the transaction
// nor a log shows: an internal transfer, found only in traces. Hand
// assembled like the token. Calldata is two words, the recipient and a
// Forward mode; every call it makes ignores the callee's result, so the
// transaction succeeds whatever the callee does.

// Forward is how the forwarder passes its value on.
type Forward byte

const (
	// ForwardDirect: the forwarder calls the identity precompile, then
	// CALLs the recipient with the value (trace address CALL_0: a call to
	// a precompile takes no trace address).
	ForwardDirect Forward = 0
	// ForwardReverted: the forwarder calls itself, and that frame CALLs
	// the recipient with the value and then reverts, undoing it; the
	// transaction still succeeds. Nothing reaches the recipient.
	ForwardReverted Forward = 1
	// ForwardNested: the forwarder calls itself with ForwardDirect, two
	// levels deep (trace address CALL_0_0).
	ForwardNested Forward = 2
	// forwardThenRevert is ForwardReverted's inner frame.
	forwardThenRevert Forward = 3

	gasForward = 300_000
	// identityPrecompile: address 0x04 copies its input.
	identityPrecompile = 4
	// forwarderDispatchLength: three mode tests of ten bytes each.
	forwarderDispatchLength = 30
)

// forwarderRuntime: a dispatcher on the mode word, then one block per mode.
func forwarderRuntime() []byte {
	op := func(ops ...vm.OpCode) []byte {
		b := make([]byte, len(ops))
		for i, o := range ops {
			b[i] = byte(o)
		}
		return b
	}
	push1 := func(v byte) []byte { return []byte{byte(vm.PUSH1), v} }
	cat := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	// CALL(gas, recipient word, callvalue, no input, no output), result dropped.
	forward := cat(push1(0), push1(0), push1(0), push1(0), op(vm.CALLVALUE), push1(0), op(vm.CALLDATALOAD), op(vm.GAS, vm.CALL, vm.POP))
	// CALL(gas, self, callvalue, memory[0:64] = (recipient, mode)), result dropped.
	selfCall := func(mode Forward) []byte {
		return cat(push1(0), op(vm.CALLDATALOAD), push1(0), op(vm.MSTORE), push1(byte(mode)), push1(32), op(vm.MSTORE),
			push1(0), push1(0), push1(64), push1(0), op(vm.CALLVALUE, vm.ADDRESS, vm.GAS, vm.CALL, vm.POP))
	}
	direct := cat(push1(0), push1(0), push1(0), push1(0), push1(identityPrecompile), op(vm.GAS, vm.STATICCALL, vm.POP), forward, op(vm.STOP))
	blocks := map[Forward][]byte{
		ForwardReverted:   cat(op(vm.JUMPDEST), selfCall(forwardThenRevert), op(vm.STOP)),
		ForwardNested:     cat(op(vm.JUMPDEST), selfCall(ForwardDirect), op(vm.STOP)),
		forwardThenRevert: cat(op(vm.JUMPDEST), forward, push1(0), push1(0), op(vm.REVERT)),
	}
	order := []Forward{ForwardReverted, ForwardNested, forwardThenRevert}
	offset := forwarderDispatchLength + len(direct)
	var dispatch, body []byte
	for _, mode := range order {
		dispatch = append(dispatch, cat(push1(32), op(vm.CALLDATALOAD), push1(byte(mode)), op(vm.EQ),
			[]byte{byte(vm.PUSH2), byte(offset >> 8), byte(offset)}, op(vm.JUMPI))...)
		body = append(body, blocks[mode]...)
		offset += len(blocks[mode])
	}
	if len(dispatch) != forwarderDispatchLength {
		panic("devchain: forwarder dispatch layout is broken")
	}
	return cat(dispatch, direct, body)
}

// forwarderInitcode deploys forwarderRuntime.
func forwarderInitcode() []byte {
	runtime := forwarderRuntime()
	const prefixLength = 12
	code := []byte{
		byte(vm.PUSH1), byte(len(runtime)), byte(vm.PUSH1), prefixLength, byte(vm.PUSH1), 0, byte(vm.CODECOPY),
		byte(vm.PUSH1), byte(len(runtime)), byte(vm.PUSH1), 0, byte(vm.RETURN),
	}
	if len(code) != prefixLength || len(runtime) > 255 {
		panic("devchain: forwarder initcode layout is broken")
	}
	return append(code, runtime...)
}

// DeployForwarder deploys the forwarder from account index from and
// returns its lowercase address.
func (c *Chain) DeployForwarder(ctx context.Context, from int) (string, Tx, error) {
	return c.deploy(ctx, from, gasDeploy, forwarderInitcode(), "forwarder")
}

// SendForward sends wei to the forwarder, which passes it on to to the
// way how says, and waits until mined.
func (c *Chain) SendForward(ctx context.Context, from int, forwarder, to string, wei *big.Int, how Forward) (Tx, error) {
	contract, err := address(forwarder)
	if err != nil {
		return Tx{}, err
	}
	recipient, err := address(to)
	if err != nil {
		return Tx{}, err
	}
	if wei == nil || wei.Sign() < 0 {
		return Tx{}, errors.New("devchain: amount must be zero or more wei")
	}
	if how != ForwardDirect && how != ForwardReverted && how != ForwardNested {
		return Tx{}, fmt.Errorf("devchain: no forward mode %d", how)
	}
	data := append(common.LeftPadBytes(recipient.Bytes(), 32), common.LeftPadBytes([]byte{byte(how)}, 32)...)
	return c.send(ctx, from, &contract, wei, gasForward, data)
}
