package bench

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/settle/settle/pkg/loadgen"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

var (
	flagIdleWindow = flag.Duration("idle.window", time.Minute, "idle window of BenchmarkIdle")
	flagIdleWarmup = flag.Duration("idle.warmup", 15*time.Second, "time given to the processes to start and settle before the idle window")
)

// BenchmarkIdle starts api, worker and scheduler with their default
// polling settings (PostgreSQL and Redis as the end-to-end benchmark has them),
// sends nothing, and reports the CPU every process used over the idle
// window as a percentage of one core.
func BenchmarkIdle(b *testing.B) {
	for range b.N {
		s := harness.NewStack(b)
		rds := ownRedis(b, s)
		s.Env["LOG_LEVEL"] = "warn"
		// The deployed defaults, not the harness's short test intervals.
		delete(s.Env, "POLL_INTERVAL")
		delete(s.Env, "WORKER_POLL_INTERVAL")
		if *flagExtraEnv != "" {
			applyEnv(s.Env, *flagExtraEnv)
		}
		api, worker, scheduler := s.StartAPI(nil), s.StartWorker(nil), s.StartScheduler(nil)
		pg := testenv.Postgres(b)
		if pg == nil {
			b.Fatal("the idle benchmark needs the harness's own PostgreSQL (unset TEST_DATABASE_URL)")
		}
		procs := []loadgen.Proc{
			{Name: "api", Pid: api.Pid()}, {Name: "worker", Pid: worker.Pid()}, {Name: "scheduler", Pid: scheduler.Pid()},
			{Name: "postgres", Pid: pg.Pid()}, {Name: "redis", Pid: rds.Pid()},
		}
		time.Sleep(*flagIdleWarmup)
		use, err := loadgen.MeasureIdle(b.Context(), procs, *flagIdleWindow)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Printf("idle CPU over %.1fs (%% of one core):\n%s", use.WindowSeconds, use.Text())
		b.ReportMetric(use.CorePercent[loadgen.CPUTotal], "idle-core-%")
		b.ReportMetric(use.StealCorePercent, "steal-core-%")
		b.ReportMetric(0, "ns/op")
	}
}
