package bench

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/settle/settle/pkg/loadgen"
	"github.com/settle/settle/pkg/redisconn"
	"github.com/settle/settle/pkg/testenv"
	"github.com/settle/settle/test/harness"
)

var (
	flagFloorEvents = flag.Int("floor.events", 3000, "events BenchmarkTrickleFloor sends")
	flagFloorRate   = flag.Float64("floor.rate", 120, "webhooks per second BenchmarkTrickleFloor sends, duplicates included (as -e2e.rate)")
	flagFloorDups   = flag.Int("floor.duplicates", 20, "percent of events BenchmarkTrickleFloor delivers a second time (as -e2e.duplicates)")
	flagFloorExtra  = flag.Int("floor.extra-statements", 0, "trivial statements the skeleton worker adds to each of its round trips")
	flagFloorProcs  = flag.Int("floor.gomaxprocs", 0, "GOMAXPROCS of the skeleton's processes (0: the runtime's default); settle's own adapt theirs (pkg/procs) and run on one at a trickle")
	flagFloorQueue  = flag.String("floor.queue", floorQueueList, "the skeleton's queue: list (an LPUSH and a BRPOP) or asynq (settle's own: the api's hand-off, the worker's asynq server and waker)")
)

// The skeleton's processes are this test binary run again with the role
// in floorRoleVar.
const (
	floorRoleVar   = "SETTLE_FLOOR_ROLE"
	floorQueue     = "floor"
	floorBodyLimit = 1 << 16
	// floorTail is how long the last event has to finish before the
	// window closes: about a hundred times a trickle event's latency.
	floorTail = 300 * time.Millisecond

	floorQueueList  = "list"
	floorQueueAsynq = "asynq"
)

// BenchmarkTrickleFloor sends a steady trickle through the hops a deposit
// takes in settle, with nothing in them: an HTTP request to one process,
// which checks an HMAC, commits a one-row INSERT (fsync on) and pushes
// the id to Redis; a second process that pops it and commits an UPDATE
// of the row in two pipelined round trips (BEGIN and a locking SELECT,
// then the UPDATE and COMMIT), as settle's ledger does. CPU per event is
// read as BenchmarkEndToEnd reads it. What settle spends above this
// figure is its own work; this figure is what the path costs on the host.
func BenchmarkTrickleFloor(b *testing.B) {
	for range b.N {
		use := runFloor(b)
		b.ReportMetric(use.MsPerEvent[loadgen.CPUTotal], "cpu-ms/event")
		if lg := use.MsPerEvent[loadgen.CPULoadGenerator]; lg > 0 {
			b.ReportMetric(use.MsPerEvent[loadgen.CPUTotal]/lg, "x-loadgen")
		}
		b.ReportMetric(use.SwitchesPerEvent[loadgen.CPUTotal], "wake-ups/event")
	}
}

func runFloor(b *testing.B) loadgen.CPUUse {
	if q := *flagFloorQueue; q != floorQueueList && q != floorQueueAsynq {
		b.Fatalf("-floor.queue %q: want %s or %s", q, floorQueueList, floorQueueAsynq)
	}
	s := harness.NewStack(b)
	rds := ownRedis(b, s)
	ctx := b.Context()
	conn, err := pgx.Connect(ctx, s.DatabaseURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE floor_events (
		id text PRIMARY KEY, body bytea NOT NULL, status text NOT NULL DEFAULT 'enqueued',
		created_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz)`); err != nil {
		b.Fatal(err)
	}

	env := []string{"DATABASE_URL=" + s.DatabaseURL, "REDIS_URL=" + s.RedisURL, "GOGC=400", fmt.Sprintf("FLOOR_EXTRA=%d", *flagFloorExtra), "FLOOR_QUEUE=" + *flagFloorQueue}
	if *flagFloorProcs > 0 {
		env = append(env, fmt.Sprintf("GOMAXPROCS=%d", *flagFloorProcs))
	}
	api, addr := startFloorChild(b, "api", env)
	worker, _ := startFloorChild(b, "worker", env)
	procs := []loadgen.Proc{
		{Name: "api", Pid: api.Process.Pid}, {Name: "worker", Pid: worker.Process.Pid},
		{Name: "postgres", Pid: postgresPid(b)}, {Name: "redis", Pid: rds.Pid()},
	}

	client := &http.Client{Timeout: 10 * time.Second}
	send := func(id string) {
		body := harness.Payment(id, "deposit", 1, "ETH", "1.5")
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/", strings.NewReader(string(body)))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("X-Id", id)
		req.Header.Set("X-Signature", harness.Sign(body, harness.WebhookSecret))
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("skeleton api answered %d", resp.StatusCode)
		}
	}
	done := func() int {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM floor_events WHERE status = 'done'`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}

	// Warm up: connections, prepared statements, the processes' heaps.
	const warm = 50
	for i := range warm {
		send(fmt.Sprintf("warm-%d", i))
		time.Sleep(10 * time.Millisecond)
	}
	waitFloor(b, done, warm)

	events := *flagFloorEvents
	interval := time.Duration(float64(time.Second) / *flagFloorRate)
	before, err := loadgen.SampleCPU(procs)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	next := time.Now()
	pace := func(id string) {
		send(id)
		next = next.Add(interval)
		time.Sleep(time.Until(next))
	}
	for i := range events {
		pace(fmt.Sprintf("floor-%d", i))
		if rng.IntN(100) < *flagFloorDups {
			pace(fmt.Sprintf("floor-%d", rng.IntN(i+1)))
		}
	}
	time.Sleep(floorTail)
	after, err := loadgen.SampleCPU(procs)
	if err != nil {
		b.Fatal(err)
	}
	if n := done(); n != warm+events {
		b.Fatalf("%d of %d events done %v after the last was sent: the window missed work", n, warm+events, floorTail)
	}
	use := loadgen.CPUBetween(before, after, events)
	fmt.Printf("trickle floor: %d events, %d%% delivered twice, %.0f webhooks/s, queue %s\n%s", events, *flagFloorDups, *flagFloorRate, *flagFloorQueue, use.Text())
	if lg := use.MsPerEvent[loadgen.CPULoadGenerator]; lg > 0 {
		fmt.Printf("CPU per event relative to the load generator's: %.2f\n", use.MsPerEvent[loadgen.CPUTotal]/lg)
	}
	return use
}

func postgresPid(b *testing.B) int {
	pg := testenv.Postgres(b)
	if pg == nil {
		b.Fatal("the floor benchmark needs the harness's own PostgreSQL (unset TEST_DATABASE_URL)")
	}
	return pg.Pid()
}

func waitFloor(b *testing.B, done func() int, want int) {
	deadline := time.Now().Add(10 * time.Second)
	for done() != want {
		if time.Now().After(deadline) {
			b.Fatalf("the skeleton finished %d of %d events", done(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startFloorChild runs this binary again in a role; the api's first line
// on stdout is its address.
func startFloorChild(b *testing.B, role string, env []string) (*exec.Cmd, string) {
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), append(env, floorRoleVar+"="+role)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatalf("skeleton %s: %v", role, err)
	}
	return cmd, strings.TrimSpace(line)
}

// floorChild runs a skeleton role until killed; its exit code otherwise.
func floorChild(role string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "skeleton:", err)
		return 1
	}
	rdb, err := redisconn.Open(os.Getenv("REDIS_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "skeleton:", err)
		return 1
	}
	asynqQueue := os.Getenv("FLOOR_QUEUE") == floorQueueAsynq
	switch {
	case role == "api" && asynqQueue:
		err = floorAPI(ctx, pool, floorHandoff(rdb))
	case role == "api":
		err = floorAPI(ctx, pool, func(ctx context.Context, id string) error { return rdb.LPush(ctx, floorQueue, id).Err() })
	case role == "worker" && asynqQueue:
		fmt.Println("ready")
		err = floorAsynqWorker(ctx, pool, rdb)
	case role == "worker":
		fmt.Println("ready")
		err = floorWorker(ctx, pool, rdb)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	fmt.Fprintln(os.Stderr, "skeleton:", err)
	return 1
}

// floorAPI serves the skeleton's webhook; push queues a new event's id.
func floorAPI(ctx context.Context, pool *pgxpool.Pool, push func(context.Context, string) error) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr().String())
	return http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, floorBodyLimit))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		want, err := hex.DecodeString(r.Header.Get("X-Signature"))
		mac := hmac.New(sha256.New, []byte(harness.WebhookSecret))
		mac.Write(body)
		if err != nil || !hmac.Equal(want, mac.Sum(nil)) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		id := r.Header.Get("X-Id")
		tag, err := pool.Exec(ctx, `INSERT INTO floor_events (id, body) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, id, body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if tag.RowsAffected() == 0 { // a redelivery
			w.WriteHeader(http.StatusOK)
			return
		}
		if err := push(ctx, id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
}

func floorWorker(ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	extra := floorExtra()
	for {
		got, err := rdb.BRPop(ctx, 0, floorQueue).Result()
		if err != nil {
			return err
		}
		if err := floorApply(ctx, conn.Conn(), got[1], extra); err != nil {
			return err
		}
	}
}

func floorExtra() int {
	extra, _ := strconv.Atoi(os.Getenv("FLOOR_EXTRA"))
	return extra
}

// floorApply is the skeleton's ledger: round trip 1 begins and locks the
// row, round trip 2 writes and commits.
func floorApply(ctx context.Context, conn *pgx.Conn, id string, extra int) error {
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue(`SELECT body FROM floor_events WHERE id = $1 AND status = 'enqueued' FOR UPDATE`, id)
	for range extra {
		batch.Queue(`SELECT status FROM floor_events WHERE id = $1`, id)
	}
	if err := conn.SendBatch(ctx, batch).Close(); err != nil {
		return err
	}
	batch = &pgx.Batch{}
	batch.Queue(`UPDATE floor_events SET status = 'done', done_at = clock_timestamp() WHERE id = $1`, id)
	for range extra {
		batch.Queue(`SELECT status FROM floor_events WHERE id = $1`, id)
	}
	batch.Queue("COMMIT")
	return conn.SendBatch(ctx, batch).Close()
}
