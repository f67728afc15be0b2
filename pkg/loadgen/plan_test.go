package loadgen

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/settle/settle/pkg/postgres"
)

func TestPlanResolvesEveryHoldAfterIt(t *testing.T) {
	cfg := Config{Events: 400, Users: 3, UserIDBase: 1, Assets: []string{"ETH"}, RunID: "r", Mix: Mix{Withdrawals: 10, Holds: 50}, Seed: 7}
	holds, posts, voids, withdrawals := 0, 0, 0, 0
	for _, group := range buildPlan(cfg) {
		for _, r := range group {
			var body map[string]any
			require.NoError(t, json.Unmarshal(r.body, &body))
			switch body["event_type"] {
			case "withdrawal":
				withdrawals++
			case "withdrawal_hold":
				holds++
				require.NotNil(t, r.then, "a hold is followed by its resolution")
				var then map[string]any
				require.NoError(t, json.Unmarshal(r.then.body, &then))
				require.Equal(t, body["event_id"], then["hold_id"])
				require.Equal(t, body["user_id"], then["user_id"])
				require.NotContains(t, then, "amount", "a resolution takes its hold's amount")
				switch then["event_type"] {
				case "withdrawal_post":
					posts++
				case "withdrawal_void":
					voids++
				default:
					t.Fatalf("resolution %v", then)
				}
			default:
				require.Nil(t, r.then)
			}
		}
	}
	require.InDelta(t, 200, holds, 40)
	require.InDelta(t, 40, withdrawals, 20)
	require.Equal(t, holds, posts+voids)
	require.Positive(t, voids)
	require.Greater(t, posts, voids)

	cfg.Mix = Mix{Withdrawals: 60, Holds: 50}
	cfg.APIURL, cfg.WebhookSecret, cfg.AdminToken, cfg.Concurrency = "http://x", "s", "t", 1
	cfg.DB = &postgres.DB{}
	require.ErrorContains(t, cfg.validate(), "withdrawals and holds together")
}
