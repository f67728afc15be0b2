package scale

import (
	"context"
	"os"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/settle/settle/pkg/devenv"
	"github.com/settle/settle/pkg/loadgen"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

func TestExplore(t *testing.T) {
	ctx := context.Background()
	s := harness.NewStack(t)
	pg := testenv.Postgres(t)
	b, err := devenv.StartPgBouncer(ctx, devenv.PgBouncerOptions{PostgresPort: pg.Port, DefaultPoolSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mode := os.Getenv("MODE")
	s.Env["DATABASE_URL"] = b.URL("postgres", databaseName(t, s.DatabaseURL), mode)
	if os.Getenv("LISTEN_DIRECT") != "" {
		s.Env["DATABASE_LISTEN_URL"] = s.DatabaseURL
	}
	api := s.Spawn("api", nil)
	w1 := s.Spawn("worker", nil)
	s.Spawn("worker", nil)
	sch := s.Spawn("scheduler", nil)
	time.Sleep(3 * time.Second)
	for _, p := range []*harness.Proc{api, w1, sch} {
		for i := 0; i < 3; i++ {
			resp, err := http.Get(p.URL() + "/readyz")
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Logf("%s readyz %d %s", p.Name, resp.StatusCode, body)
			}
		}
	}
	db := testenv.OpenDB(t, s.DatabaseURL)
	start := time.Now()
	res, err := loadgen.Run(ctx, loadgen.Config{APIURL: api.URL(), WebhookSecret: harness.WebhookSecret, AdminToken: harness.AdminToken, DB: db,
		Events: 1000, Concurrency: 32, Users: 50, Assets: []string{"ETH"}, InitialBalance: "1000",
		Mix: loadgen.Mix{Withdrawals: 30, Duplicates: 15, ConcurrentDups: 5}, WaitTimeout: 90 * time.Second, RunID: "x"})
	t.Logf("took %s err=%v answers=%v outcomes=%v lat=%v inv=%v", time.Since(start), err, res.Answers, res.Outcomes, res.LatencyMillis, res.InvariantsOK)
	for _, p := range s.Procs {
		n := 0
		for _, l := range strings.Split(p.Logs(), "\n") {
			if strings.Contains(l, "error") || strings.Contains(l, "warn") {
				if n < 5 {
					t.Logf("%s: %s", p.Name, l)
				}
				n++
			}
		}
		t.Logf("%s: %d error/warn lines", p.Name, n)
	}
	_ = sch
}
