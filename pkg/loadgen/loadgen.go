// Package loadgen drives a running settle with signed webhooks: a mix of
// deposits, withdrawals, duplicate deliveries (some concurrent with their
// original), conflicting redeliveries and invalid requests, across many
// users and assets, at a target rate or as fast as it can. It then waits
// until every accepted event is terminal and reports throughput, latency
// percentiles and the invariant check.
package loadgen

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/pkg/invariant"
	"github.com/settle/settle/pkg/postgres"
)

// Bounds.
const (
	ConcurrencyMax = 1024
	EventsMax      = 10_000_000
	requestTimeout = 30 * time.Second
	// waitPoll is how often settlement is measured; each look counts the
	// run's events, so not too often.
	waitPoll        = time.Second
	responseBodyMax = 1 << 16
)

// Mix is the share of each kind of request, in percent of the events.
type Mix struct {
	Withdrawals int // the rest of the events are deposits (and airdrops)
	// Holds are withdrawal_holds, each resolved once it is accepted by a
	// withdrawal_post (three in four) or a withdrawal_void: two events
	// each, so a run of N events with Holds 100 stores 2N.
	Holds          int
	Duplicates     int // delivered again after the original
	ConcurrentDups int // delivered twice at the same instant
	Conflicts      int // same event id, other amount (expect 409)
	Invalid        int // bad signature, malformed body, number amount, unknown asset (expect 4xx)
}

// Config describes a run.
type Config struct {
	APIURL        string
	WebhookSecret string
	AdminToken    string
	// DB lets the run seed balances, wait for settlement and check the
	// invariants; required.
	DB             *postgres.DB
	Events         int
	Rate           float64 // events per second; 0 = as fast as possible
	Concurrency    int
	Users          int
	UserIDBase     int64
	Assets         []string
	InitialBalance string // per user and asset, for withdrawals to draw on
	Mix            Mix
	RunID          string // prefixes event ids; defaults to the start time
	WaitTimeout    time.Duration
	Progress       io.Writer // nil: no progress bar
	Seed           uint64
	// OnSending and OnSettled, if set, mark the measured window: after
	// seeding, before the first request; after settlement, before the
	// invariant check.
	OnSending func()
	// OnIngested runs once every request has been answered, before the
	// wait for terminal statuses.
	OnIngested func()
	OnSettled  func()
	// Procs, if set, are the processes whose CPU the run measures over the
	// window (sending to settled) and reports per event; see CPUUse.
	Procs []Proc
}

// Result is what a run measured.
type Result struct {
	RunID            string             `json:"run_id"`
	Events           int                `json:"events"`
	Requests         int64              `json:"requests"`
	Answers          map[string]int64   `json:"answers"` // "200 accepted", "200 duplicate", "409", "400", ...
	Unexpected       int64              `json:"unexpected"`
	IngestSeconds    float64            `json:"ingest_seconds"`
	AcceptedPerSec   float64            `json:"accepted_per_second"`
	SettleSeconds    float64            `json:"settle_seconds"`
	AppliedPerSec    float64            `json:"applied_per_second"`
	Terminal         int                `json:"terminal"`
	Outcomes         map[string]int64   `json:"outcomes"`
	LatencyMillis    map[string]float64 `json:"latency_ms"` // webhook accepted -> terminal, p50/p95/p99/max
	RequestMillis    map[string]float64 `json:"request_ms"` // HTTP round trip of accepted webhooks
	InvariantsOK     bool               `json:"invariants_ok"`
	InvariantsReport string             `json:"invariants_report"`
	// CPU is set when Config.Procs is: per event, over terminal events.
	CPU *CPUUse `json:"cpu,omitempty"`
}

type kind int

const (
	deposit kind = iota
	withdrawal
	duplicate
	concurrentDuplicate
	conflict
	invalidSignature
	malformedBody
	numberAmount
	unknownAsset
	hold
	resolution
)

type request struct {
	kind   kind
	body   []byte
	expect []int // acceptable status codes
	// then is sent by the same sender once this request is answered 200:
	// a hold's post or void, which the api takes only after its hold.
	then *request
}

// Run executes one load run.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	if cfg.RunID == "" {
		cfg.RunID = "load-" + strconv.FormatInt(time.Now().UnixMilli(), 36)
	}
	res := Result{RunID: cfg.RunID, Events: cfg.Events, Answers: map[string]int64{}, Outcomes: map[string]int64{}}
	client := &http.Client{Timeout: requestTimeout, Transport: &http.Transport{
		MaxIdleConns: cfg.Concurrency * 2, MaxIdleConnsPerHost: cfg.Concurrency * 2, IdleConnTimeout: time.Minute,
	}}
	if err := seed(ctx, cfg, client); err != nil {
		return res, err
	}
	plan := buildPlan(cfg)

	var mu sync.Mutex
	var requestLatencies []float64
	var requests, unexpected atomic.Int64
	record := func(r request, status int, answer string, took time.Duration) {
		requests.Add(1)
		key := strconv.Itoa(status)
		if answer != "" {
			key += " " + answer
		}
		ok := false
		for _, s := range r.expect {
			ok = ok || s == status
		}
		mu.Lock()
		res.Answers[key]++
		if status == http.StatusOK && answer == "accepted" {
			requestLatencies = append(requestLatencies, float64(took.Microseconds())/1000)
		}
		mu.Unlock()
		if !ok {
			unexpected.Add(1)
		}
	}

	work := make(chan []request, cfg.Concurrency)
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for group := range work {
				// A group is sent concurrently: a concurrent duplicate
				// races its original.
				var inner sync.WaitGroup
				for _, r := range group {
					inner.Add(1)
					go func(r request) {
						defer inner.Done()
						started := time.Now()
						status, answer, err := post(ctx, client, cfg, r)
						if err != nil {
							record(r, 0, "error", time.Since(started))
							return
						}
						record(r, status, answer, time.Since(started))
						if r.then != nil && status == http.StatusOK {
							started = time.Now()
							status, answer, err = post(ctx, client, cfg, *r.then)
							if err != nil {
								status, answer = 0, "error"
							}
							record(*r.then, status, answer, time.Since(started))
						}
					}(r)
				}
				inner.Wait()
			}
		}()
	}

	if cfg.OnSending != nil {
		cfg.OnSending()
	}
	var cpuBefore CPUSample
	if len(cfg.Procs) > 0 {
		var err error
		if cpuBefore, err = SampleCPU(cfg.Procs); err != nil {
			close(work)
			wg.Wait()
			return res, err
		}
	}
	started := time.Now()
	progress := newBar(cfg.Progress, len(plan))
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(time.Second) / cfg.Rate)
	}
	next := time.Now()
send:
	for i, group := range plan {
		if interval > 0 {
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
			next = next.Add(interval)
		}
		select {
		case work <- group:
		case <-ctx.Done():
			break send
		}
		progress.set(i+1, requests.Load())
	}
	close(work)
	wg.Wait()
	res.IngestSeconds = time.Since(started).Seconds()
	res.Requests, res.Unexpected = requests.Load(), unexpected.Load()
	accepted := res.Answers["200 accepted"]
	res.AcceptedPerSec = float64(accepted) / res.IngestSeconds
	res.RequestMillis = percentiles(requestLatencies)
	progress.done()
	if ctx.Err() != nil {
		return res, ctx.Err()
	}

	if cfg.OnIngested != nil {
		cfg.OnIngested()
	}
	if err := waitTerminal(ctx, cfg, int(accepted), progress); err != nil {
		return res, err
	}
	var cpuAfter CPUSample
	if len(cfg.Procs) > 0 {
		var err error
		if cpuAfter, err = SampleCPU(cfg.Procs); err != nil {
			return res, err
		}
	}
	if cfg.OnSettled != nil {
		cfg.OnSettled()
	}
	stats, err := cfg.DB.RunStats(ctx, cfg.RunID+"-")
	if err != nil {
		return res, err
	}
	res.Terminal = stats.Terminal
	res.Outcomes = stats.Outcomes
	res.SettleSeconds = stats.LastTerminal.Sub(stats.FirstAccepted).Seconds()
	if res.SettleSeconds > 0 {
		res.AppliedPerSec = float64(stats.Terminal) / res.SettleSeconds
	}
	res.LatencyMillis = stats.LatencyMillis
	if len(cfg.Procs) > 0 {
		use := CPUBetween(cpuBefore, cpuAfter, stats.Terminal)
		res.CPU = &use
	}
	report, err := invariant.Check(ctx, cfg.DB, invariant.Options{RequireTerminal: true})
	if err != nil {
		return res, err
	}
	res.InvariantsOK, res.InvariantsReport = report.OK(), report.String()
	return res, nil
}

func (cfg *Config) validate() error {
	switch {
	case cfg.APIURL == "" || cfg.WebhookSecret == "" || cfg.AdminToken == "":
		return errors.New("api url, webhook secret and admin token are required")
	case cfg.DB == nil:
		return errors.New("a database connection is required (DATABASE_URL)")
	}
	if err := cfg.CheckValues(); err != nil {
		return err
	}
	if cfg.UserIDBase <= 0 {
		cfg.UserIDBase = 1
	}
	if cfg.WaitTimeout <= 0 {
		cfg.WaitTimeout = 10 * time.Minute
	}
	if cfg.InitialBalance == "" {
		cfg.InitialBalance = "0"
	}
	return nil
}

// CheckValues checks the run's numbers, shares and assets, which need no
// connection: a caller (settlectl load) refuses a bad one before it
// connects to anything. Zero UserIDBase, WaitTimeout and InitialBalance
// take their defaults.
func (cfg *Config) CheckValues() error {
	switch {
	case cfg.Events <= 0 || cfg.Events > EventsMax:
		return fmt.Errorf("events must be 1..%d", EventsMax)
	case cfg.Concurrency <= 0 || cfg.Concurrency > ConcurrencyMax:
		return fmt.Errorf("concurrency must be 1..%d", ConcurrencyMax)
	case cfg.Users <= 0:
		return errors.New("users must be positive")
	case len(cfg.Assets) == 0:
		return errors.New("at least one asset")
	case len(cfg.Procs) > ProcsMax:
		return fmt.Errorf("at most %d processes to measure", ProcsMax)
	}
	m := cfg.Mix
	for _, p := range []int{m.Withdrawals, m.Holds, m.Duplicates, m.ConcurrentDups, m.Conflicts, m.Invalid} {
		if p < 0 || p > 100 {
			return errors.New("mix percentages must be 0..100")
		}
	}
	if m.Withdrawals+m.Holds > 100 {
		return errors.New("withdrawals and holds together must be at most 100 percent")
	}
	switch {
	case cfg.UserIDBase < 0:
		return errors.New("user id base must be positive")
	case cfg.WaitTimeout < 0:
		return errors.New("wait timeout must not be negative")
	case math.IsNaN(cfg.Rate) || math.IsInf(cfg.Rate, 0) || cfg.Rate < 0:
		// A negative or NaN rate ran flat out, as if 0.
		return errors.New("rate must be a number from 0 (0: as fast as possible)")
	}
	for _, a := range cfg.Assets {
		if a == "" {
			return errors.New("assets must be codes separated by single commas")
		}
	}
	if cfg.InitialBalance != "" {
		if b, err := decimal.NewFromString(cfg.InitialBalance); err != nil || b.IsNegative() {
			return errors.New("initial balance must be a decimal number from 0")
		}
	}
	return nil
}

// seed creates the users (through the admin API, as an integrator would)
// and gives them their initial balances.
func seed(ctx context.Context, cfg Config, client *http.Client) error {
	initial := decimal.RequireFromString(cfg.InitialBalance)
	for i := range cfg.Users {
		id := cfg.UserIDBase + int64(i)
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, fmt.Sprintf("%s/admin/users/%d", cfg.APIURL, id), nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+cfg.AdminToken)
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("create user %d: %w", id, err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, responseBodyMax))
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
			return fmt.Errorf("create user %d: %s", id, resp.Status)
		}
		if initial.IsPositive() {
			for _, asset := range cfg.Assets {
				// Refused once the balance has journal rows: a rerun
				// against the same users keeps what they have.
				_ = cfg.DB.SetInitialBalance(ctx, id, asset, initial)
			}
		}
	}
	return nil
}

var amounts = []string{"1.5", "0.25", "2", "0.1", "3.000001", "0.000001", "7", "10.5"}

// buildPlan lays out every request group in sending order.
func buildPlan(cfg Config) [][]request {
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5e771e))
	pct := func(p int) bool { return rng.IntN(100) < p }
	var plan, conflicts [][]request
	var originals []request
	for i := range cfg.Events {
		id := fmt.Sprintf("%s-%d", cfg.RunID, i)
		user := cfg.UserIDBase + int64(rng.IntN(cfg.Users))
		asset := cfg.Assets[rng.IntN(len(cfg.Assets))]
		amount := amounts[rng.IntN(len(amounts))]
		eventType := "deposit"
		switch draw := rng.IntN(100); {
		case draw < cfg.Mix.Withdrawals:
			eventType = "withdrawal"
		case draw < cfg.Mix.Withdrawals+cfg.Mix.Holds:
			eventType = "withdrawal_hold"
		case i%10 == 9:
			eventType = "airdrop"
		}
		body := payment(id, eventType, user, asset, amount)
		r := request{kind: deposit, body: body, expect: []int{http.StatusOK}}
		switch eventType {
		case "withdrawal":
			r.kind = withdrawal
		case "withdrawal_hold":
			r.kind = hold
			r.then = resolve(id, user, i%4 != 3)
		}
		group := []request{r}
		if pct(cfg.Mix.ConcurrentDups) {
			group = append(group, request{kind: concurrentDuplicate, body: body, expect: []int{http.StatusOK}})
		}
		plan = append(plan, group)
		originals = append(originals, r)
		if pct(cfg.Mix.Duplicates) && len(originals) > 0 {
			// A redelivery of an earlier event, as a provider retries.
			earlier := originals[rng.IntN(len(originals))]
			plan = append(plan, []request{{kind: duplicate, body: earlier.body, expect: []int{http.StatusOK}}})
		}
		if pct(cfg.Mix.Conflicts) {
			// Sent after every original, so the original is the one stored.
			// One whole unit more: a different amount valid for any asset.
			other := payment(id, eventType, user, asset, decimal.RequireFromString(amount).Add(decimal.NewFromInt(1)).String())
			conflicts = append(conflicts, []request{{kind: conflict, body: other, expect: []int{http.StatusConflict}}})
		}
		if pct(cfg.Mix.Invalid) {
			plan = append(plan, []request{invalidRequest(rng, cfg.RunID, i, user)})
		}
	}
	return append(plan, conflicts...)
}

func payment(id, eventType string, user int64, asset, amount string) []byte {
	b, _ := json.Marshal(map[string]any{"event_id": id, "event_type": eventType, "user_id": user, "asset": asset, "amount": amount})
	return b
}

// resolve is the post (or void) of hold holdID, named after it; it
// leaves the amount out, which the api takes from the hold.
func resolve(holdID string, user int64, post bool) *request {
	eventType, suffix := "withdrawal_post", "-post"
	if !post {
		eventType, suffix = "withdrawal_void", "-void"
	}
	b, _ := json.Marshal(map[string]any{"event_id": holdID + suffix, "event_type": eventType, "user_id": user, "hold_id": holdID})
	return &request{kind: resolution, body: b, expect: []int{http.StatusOK}}
}

func invalidRequest(rng *rand.Rand, run string, i int, user int64) request {
	id := fmt.Sprintf("%s-bad-%d", run, i)
	switch rng.IntN(4) {
	case 0:
		return request{kind: invalidSignature, body: payment(id, "deposit", user, "ETH", "1"), expect: []int{http.StatusUnauthorized}}
	case 1:
		return request{kind: malformedBody, body: []byte(`{"event_id": "` + id + `", "amount": `), expect: []int{http.StatusBadRequest}}
	case 2:
		body := []byte(fmt.Sprintf(`{"event_id":%q,"event_type":"deposit","user_id":%d,"amount":1.5}`, id, user))
		return request{kind: numberAmount, body: body, expect: []int{http.StatusBadRequest}}
	default:
		return request{kind: unknownAsset, body: payment(id, "deposit", user, "DOGE", "1"), expect: []int{http.StatusBadRequest}}
	}
}

func sign(body []byte, secret string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

func post(ctx context.Context, client *http.Client, cfg Config, r request) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.APIURL+"/webhook/payments", bytes.NewReader(r.body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	signature := sign(r.body, cfg.WebhookSecret)
	if r.kind == invalidSignature {
		signature = sign(r.body, cfg.WebhookSecret+"x")
	}
	req.Header.Set("X-Signature", signature)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, responseBodyMax))
	if err != nil {
		return resp.StatusCode, "", err
	}
	var answer struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(data, &answer)
	return resp.StatusCode, answer.Status, nil
}

func waitTerminal(ctx context.Context, cfg Config, accepted int, bar *bar) error {
	deadline := time.Now().Add(cfg.WaitTimeout)
	for {
		stats, err := cfg.DB.RunStats(ctx, cfg.RunID+"-")
		if err != nil {
			return err
		}
		bar.settling(stats.Terminal, accepted)
		if stats.Terminal >= stats.Accepted && stats.Accepted >= accepted {
			bar.done()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d events still not terminal after %s", stats.Accepted-stats.Terminal, stats.Accepted, cfg.WaitTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(waitPoll):
		}
	}
}

// MeasureIdle is the CPU procs use over window while nothing is sent.
func MeasureIdle(ctx context.Context, procs []Proc, window time.Duration) (CPUUse, error) {
	before, err := SampleCPU(procs)
	if err != nil {
		return CPUUse{}, err
	}
	select {
	case <-ctx.Done():
		return CPUUse{}, ctx.Err()
	case <-time.After(window):
	}
	after, err := SampleCPU(procs)
	if err != nil {
		return CPUUse{}, err
	}
	return CPUBetween(before, after, 0), nil
}

func percentiles(values []float64) map[string]float64 {
	out := map[string]float64{}
	if len(values) == 0 {
		return out
	}
	sort.Float64s(values)
	at := func(q float64) float64 {
		i := int(q * float64(len(values)-1))
		return values[i]
	}
	out["p50"], out["p95"], out["p99"], out["max"] = at(0.50), at(0.95), at(0.99), values[len(values)-1]
	return out
}
