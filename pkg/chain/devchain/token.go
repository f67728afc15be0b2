package devchain

import (
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/vm"
)

// There is no Solidity compiler here, so the dev token is assembled by
// hand. Its whole job is what settle reads from a receipt: called with
// transfer(address to, uint256 value) calldata (the standard selector and
// exactly 68 bytes), it emits the standard
// Transfer(address indexed from, address indexed to, uint256 value) log
// with from = the caller and returns true. Any other calldata reverts,
// which is how tests get a receipt with status 0. It keeps no balances:
// a dev token that mints on transfer is enough to exercise deposits.

// transferSelector is the first four bytes of keccak256("transfer(address,uint256)").
var transferSelector = []byte{0xa9, 0x05, 0x9c, 0xbb}

// transferTopic is keccak256("Transfer(address,address,uint256)").
var transferTopic = common.HexToHash("0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef")

// transferCalldataLength: selector plus two 32-byte words.
const transferCalldataLength = 4 + 32 + 32

// tokenRuntime assembles the contract's code; jump targets are patched
// in as their positions become known.
func tokenRuntime() []byte {
	revert := []byte{byte(vm.PUSH1), 0, byte(vm.PUSH1), 0, byte(vm.REVERT)}
	var code []byte

	// Calldata must be exactly selector + (to, value).
	code = append(code, byte(vm.CALLDATASIZE), byte(vm.PUSH1), transferCalldataLength, byte(vm.EQ), byte(vm.PUSH1), 0, byte(vm.JUMPI))
	lengthOK := len(code) - 2
	code = append(code, revert...)
	code[lengthOK] = byte(len(code))
	code = append(code, byte(vm.JUMPDEST))

	// The selector must be transfer(address,uint256).
	code = append(code, byte(vm.PUSH1), 0, byte(vm.CALLDATALOAD), byte(vm.PUSH1), 224, byte(vm.SHR), byte(vm.PUSH4))
	code = append(code, transferSelector...)
	code = append(code, byte(vm.EQ), byte(vm.PUSH1), 0, byte(vm.JUMPI))
	selectorOK := len(code) - 2
	code = append(code, revert...)
	code[selectorOK] = byte(len(code))
	code = append(code, byte(vm.JUMPDEST))

	// memory[0:32] = value, the log's data.
	code = append(code, byte(vm.PUSH1), 36, byte(vm.CALLDATALOAD), byte(vm.PUSH1), 0, byte(vm.MSTORE))
	// LOG3 pops offset, size, topic0, topic1, topic2: push them in
	// reverse. topic2 = to, cut to 160 bits as an address is.
	code = append(code, byte(vm.PUSH1), 4, byte(vm.CALLDATALOAD),
		byte(vm.PUSH1), 96, byte(vm.SHL), byte(vm.PUSH1), 96, byte(vm.SHR))
	code = append(code, byte(vm.CALLER), byte(vm.PUSH32))
	code = append(code, transferTopic.Bytes()...)
	code = append(code, byte(vm.PUSH1), 32, byte(vm.PUSH1), 0, byte(vm.LOG3))
	// return true
	code = append(code, byte(vm.PUSH1), 1, byte(vm.PUSH1), 0, byte(vm.MSTORE),
		byte(vm.PUSH1), 32, byte(vm.PUSH1), 0, byte(vm.RETURN))
	return code
}

// tokenInitcode deploys tokenRuntime: copy it to memory and return it.
func tokenInitcode() []byte {
	runtime := tokenRuntime()
	const prefixLength = 12
	code := []byte{
		byte(vm.PUSH1), byte(len(runtime)), byte(vm.PUSH1), prefixLength, byte(vm.PUSH1), 0, byte(vm.CODECOPY),
		byte(vm.PUSH1), byte(len(runtime)), byte(vm.PUSH1), 0, byte(vm.RETURN),
	}
	if len(code) != prefixLength || len(runtime) > 255 {
		panic("devchain: token initcode layout is broken")
	}
	return append(code, runtime...)
}

// transferCalldata encodes transfer(to, value).
func transferCalldata(to common.Address, value *big.Int) []byte {
	data := make([]byte, 0, transferCalldataLength)
	data = append(data, transferSelector...)
	data = append(data, common.LeftPadBytes(to.Bytes(), 32)...)
	return append(data, common.LeftPadBytes(value.Bytes(), 32)...)
}

// revertingCalldata is anything but transfer calldata.
var revertingCalldata = []byte{0xde, 0xad, 0xbe, 0xef}
