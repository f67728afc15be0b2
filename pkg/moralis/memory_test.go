package moralis_test

// Memory held while an unauthenticated body is verified.

import (
	"fmt"
	"strings"
	"testing"

	"github.com/settle/settle/pkg/moralis"
	"github.com/settle/settle/pkg/testenv"
)

// TestVerifyHoldsLittleOfAnUnsignedBody: Verify runs on bodies nobody has
// authenticated yet (the signature is what it checks), and the api bounds
// those by their bytes only (INGEST_UNVERIFIED_BYTES_MAX, 4 MiB a body).
// A serialiser that built a tree first held ~75x a body of empty objects
// (an allocation or three per "{}"), ~300 MiB for one 4 MiB body; what
// Verify holds must stay a small multiple of the bytes the budget counts,
// for bodies of many small values and for one object of many members
// (whose members are held until it closes, to be put in key order).
func TestVerifyHoldsLittleOfAnUnsignedBody(t *testing.T) {
	const bodyMax = 4 << 20 // every provider route's limit (httpapi.ProviderBodyMaxDefault)
	var members strings.Builder
	members.WriteString("{")
	for i := 0; members.Len() < bodyMax-32; i++ {
		if i > 0 {
			members.WriteString(",")
		}
		fmt.Fprintf(&members, `"%d":{},"k%d":[]`, i, i)
	}
	members.WriteString("}")
	bodies := map[string][]byte{
		"array of empty objects":     []byte("[" + strings.TrimSuffix(strings.Repeat("{},", bodyMax/3), ",") + "]"),
		"one object of many members": []byte(members.String()),
	}
	forged := "0x" + strings.Repeat("0", 64)
	for name, body := range bodies {
		var ok bool
		peak := testenv.PeakHeapGrowth(func() { ok = moralis.Verify(body, forged, []byte("secret")) })
		if ok {
			t.Fatal("forged signature verified")
		}
		t.Logf("%s, %d bytes: peak live heap +%d MiB during Verify", name, len(body), peak>>20)
		if limit := uint64(8 * len(body)); peak > limit {
			t.Errorf("%s: verifying one unsigned %d-byte body held %d MiB live (> %d MiB = 8x the body): "+
				"16 such bodies fit INGEST_UNVERIFIED_BYTES_MAX (64 MiB) at once, ~%d GiB of heap",
				name, len(body), peak>>20, limit>>20, 16*peak>>30)
		}
	}
}
