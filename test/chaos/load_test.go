package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/shopspring/decimal"

	"github.com/settle/settle/test/harness"
)

// Sender bounds.
const (
	// groupsInFlightMax bounds the event groups being delivered at once;
	// when the api is down they all wait and sending pauses, as a
	// provider's delivery queue backs up.
	groupsInFlightMax = 48
	// deliveryMax bounds the redeliveries of one webhook: past it the
	// delivery is reported as never answered.
	deliveryMax      = 3 * time.Minute
	attemptTimeout   = 15 * time.Second
	backoffMin       = 100 * time.Millisecond
	backoffMax       = 2 * time.Second
	eventsMax        = 1_000_000
	anomalySamples   = 20
	responseBytesMax = 1 << 16
	// redeliveryWindow is how far back a redelivery reaches.
	redeliveryWindow = 200
	// unknownUser is never created: a webhook for it is a 400.
	unknownUser = 9_000_001
)

// mix is the share of each kind of delivery, in percent of the events.
var mix = struct{ holds, withdrawals, concurrentDups, redeliveries, conflicts, invalid int }{
	holds: 8, withdrawals: 35, concurrentDups: 5, redeliveries: 15, conflicts: 3, invalid: 4,
}

// holdMix is what a group does with its hold once the api acknowledged it,
// in percent of the holds: it always posts or voids it (half each); then
// sometimes resolves it a second time (that one must end hold_closed),
// has another user post it (unknown_hold), or redelivers its resolution.
var holdMix = struct{ second, stranger, again int }{second: 20, stranger: 15, again: 15}

var amounts = []string{"1.5", "0.25", "2", "0.1", "3.000001", "0.000001", "7", "10.5", "50.00"}

// spec is one event as the provider knows it.
type spec struct {
	ID     string `json:"event_id"`
	Type   string `json:"event_type"`
	User   int64  `json:"user_id"`
	Asset  string `json:"asset"`
	Amount string `json:"amount"`
	HoldID string `json:"hold_id,omitempty"` // a post's or void's
}

func (s spec) body() []byte {
	b, _ := json.Marshal(s)
	return b
}

func (s spec) credit() bool { return s.Type == "deposit" || s.Type == "airdrop" }

type deliveryKind string

const (
	original      deliveryKind = "original"
	concurrentDup deliveryKind = "concurrent-duplicate"
	redelivery    deliveryKind = "redelivery"
	conflict      deliveryKind = "conflict"
	invalid       deliveryKind = "invalid"
	resolution    deliveryKind = "hold-resolution"
)

// delivery is one webhook the provider keeps sending until it gets a
// definitive answer.
type delivery struct {
	kind    deliveryKind
	eventID string
	body    []byte
	badSig  bool
	expect  []int
	label   string // for invalid ones: what is wrong
}

// group is what one tick of the load sends: an event, its concurrent
// twin, then perhaps a conflicting version, a redelivery of an earlier
// event, and an invalid request.
type group struct {
	event      spec
	twin       bool
	conflict   bool
	redeliver  int // index of an earlier event, or -1
	invalid    *delivery
	eventIndex int
	// A hold's posts and voids, sent in order once the hold is
	// acknowledged; again redelivers follow[resolves], its own resolution.
	follow   []spec
	resolves int
	again    bool
}

// sender delivers signed webhooks at least once: every delivery is
// repeated until the api gives a definitive answer (2xx or 4xx other
// than 429), exactly as a payment provider redelivers.
type sender struct {
	apiURL string
	runID  string
	users  []int64
	assets []string
	rate   float64
	client *http.Client
	rng    *rand.Rand // the plan; used by the dispatching goroutine only

	mu        sync.Mutex
	events    []spec               // by index, as planned
	acked     map[string]time.Time // first 200 for the event's content
	accepted  map[string]int       // "accepted" answers per event
	answers   map[string]int       // "<kind> <status> <answer>" -> count
	retried   map[string]int       // why a delivery was repeated -> count
	anomalies []string             // samples of answers the contract forbids
	anomalous int
	undeliv   []string
	sent      int
}

func newSender(apiURL, runID string, seed uint64, rate float64, users []int64, assets []string) *sender {
	return &sender{
		apiURL: apiURL, runID: runID, users: users, assets: assets, rate: rate,
		client: &http.Client{Timeout: attemptTimeout, Transport: &http.Transport{
			MaxIdleConns: groupsInFlightMax * 2, MaxIdleConnsPerHost: groupsInFlightMax * 2, IdleConnTimeout: time.Minute,
		}},
		rng:      rand.New(rand.NewPCG(seed, 0x10ad)),
		acked:    map[string]time.Time{},
		accepted: map[string]int{},
		answers:  map[string]int{},
		retried:  map[string]int{},
	}
}

// plan draws the next group from the seeded plan.
func (s *sender) plan(i int) group {
	pct := func(p int) bool { return s.rng.IntN(100) < p }
	e := spec{
		ID:     fmt.Sprintf("%s-%d", s.runID, i),
		Type:   "deposit",
		User:   s.users[s.rng.IntN(len(s.users))],
		Asset:  s.assets[s.rng.IntN(len(s.assets))],
		Amount: amounts[s.rng.IntN(len(amounts))],
	}
	switch {
	case pct(mix.holds):
		e.Type = "withdrawal_hold"
	case pct(mix.withdrawals):
		e.Type = "withdrawal"
		if i%10 == 7 {
			e.Type = "withdrawal_fee"
		}
	case i%10 == 9:
		e.Type = "airdrop"
	}
	g := group{event: e, eventIndex: i, redeliver: -1}
	g.twin = pct(mix.concurrentDups)
	g.conflict = pct(mix.conflicts)
	if pct(mix.redeliveries) && i > 0 {
		g.redeliver = i - 1 - s.rng.IntN(min(i, redeliveryWindow))
	}
	if pct(mix.invalid) {
		g.invalid = s.invalidDelivery(i)
	}
	if e.Type == "withdrawal_hold" {
		s.planHold(&g, pct)
	}
	return g
}

// planHold draws what happens to the group's hold after its 200.
func (s *sender) planHold(g *group, pct func(int) bool) {
	e := g.event
	resolve := func(suffix string, user int64) spec {
		typ := "withdrawal_post"
		if s.rng.IntN(2) == 0 {
			typ = "withdrawal_void"
		}
		return spec{ID: e.ID + suffix, Type: typ, User: user, Asset: e.Asset, Amount: e.Amount, HoldID: e.ID}
	}
	if pct(holdMix.stranger) {
		other := e.User
		for other == e.User {
			other = s.users[s.rng.IntN(len(s.users))]
		}
		stranger := resolve("-stranger", other)
		stranger.Type = "withdrawal_post"
		g.follow = append(g.follow, stranger)
	}
	g.resolves = len(g.follow)
	g.follow = append(g.follow, resolve("-resolve", e.User))
	if pct(holdMix.second) {
		g.follow = append(g.follow, resolve("-again", e.User))
	}
	g.again = pct(holdMix.again)
}

func (s *sender) invalidDelivery(i int) *delivery {
	id := fmt.Sprintf("%s-bad-%d", s.runID, i)
	user := s.users[s.rng.IntN(len(s.users))]
	d := &delivery{kind: invalid, eventID: id, expect: []int{http.StatusBadRequest}}
	switch s.rng.IntN(5) {
	case 0:
		d.label, d.badSig, d.expect = "bad signature", true, []int{http.StatusUnauthorized}
		d.body = spec{ID: id, Type: "deposit", User: user, Asset: "ETH", Amount: "1"}.body()
	case 1:
		d.label, d.body = "malformed JSON", []byte(`{"event_id": "`+id+`", "amount": `)
	case 2:
		d.label, d.body = "number amount", []byte(fmt.Sprintf(`{"event_id":%q,"event_type":"deposit","user_id":%d,"amount":1.5}`, id, user))
	case 3:
		d.label, d.body = "unknown asset", spec{ID: id, Type: "deposit", User: user, Asset: "DOGE", Amount: "1"}.body()
	default:
		d.label, d.body = "unknown user", spec{ID: id, Type: "deposit", User: unknownUser, Asset: "ETH", Amount: "1"}.body()
	}
	return d
}

// run sends groups at the rate until stop is closed, then waits for
// every delivery under way to get its answer (each is bounded).
func (s *sender) run(ctx context.Context, stop <-chan struct{}) {
	slots := make(chan struct{}, groupsInFlightMax)
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / s.rate)
	next := time.Now()
dispatch:
	for i := 0; i < eventsMax; i++ {
		if wait := time.Until(next); wait > 0 {
			select {
			case <-time.After(wait):
			case <-stop:
				break dispatch
			case <-ctx.Done():
				break dispatch
			}
		}
		// After a stall, resume at the rate rather than in a burst.
		next = next.Add(interval)
		if behind := time.Now().Add(-interval); next.Before(behind) {
			next = behind
		}
		g := s.plan(i)
		s.mu.Lock()
		s.events = append(s.events, g.event)
		s.mu.Unlock()
		select {
		case slots <- struct{}{}:
		case <-stop:
			break dispatch
		case <-ctx.Done():
			break dispatch
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			s.send(ctx, g)
		}()
	}
	wg.Wait()
}

func (s *sender) send(ctx context.Context, g group) {
	e := g.event
	body := e.body()
	deliver := func(d delivery) { s.deliver(ctx, d) }
	// The original and, sometimes, its twin at the same instant.
	var twins sync.WaitGroup
	copies := 1
	if g.twin {
		copies = 2
	}
	for n := range copies {
		kind := original
		if n == 1 {
			kind = concurrentDup
		}
		twins.Add(1)
		go func() {
			defer twins.Done()
			deliver(delivery{kind: kind, eventID: e.ID, body: body, expect: []int{http.StatusOK}})
		}()
	}
	twins.Wait()
	if g.conflict && s.isAcked(e.ID) {
		// Same id, other content: only after the original was answered,
		// so the original is the one stored.
		other := e
		other.Amount = decimal.RequireFromString(e.Amount).Add(decimal.NewFromInt(1)).String()
		deliver(delivery{kind: conflict, eventID: e.ID, body: other.body(), expect: []int{http.StatusConflict}})
	}
	if len(g.follow) > 0 && s.isAcked(e.ID) {
		// Only after the hold's 200: a post of an id the api has not
		// stored names no hold and ends unknown_hold for good.
		for _, f := range g.follow {
			s.mu.Lock()
			s.events = append(s.events, f)
			s.mu.Unlock()
			deliver(delivery{kind: resolution, eventID: f.ID, body: f.body(), expect: []int{http.StatusOK}})
		}
		if f := g.follow[g.resolves]; g.again && s.isAcked(f.ID) {
			deliver(delivery{kind: redelivery, eventID: f.ID, body: f.body(), expect: []int{http.StatusOK}})
		}
	}
	if g.redeliver >= 0 {
		s.mu.Lock()
		earlier := s.events[g.redeliver]
		s.mu.Unlock()
		deliver(delivery{kind: redelivery, eventID: earlier.ID, body: earlier.body(), expect: []int{http.StatusOK}})
	}
	if g.invalid != nil {
		deliver(*g.invalid)
	}
}

func (s *sender) isAcked(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.acked[id]
	return ok
}

// deliver repeats d until a definitive answer and checks that answer.
func (s *sender) deliver(ctx context.Context, d delivery) {
	s.mu.Lock()
	_, ackedBefore := s.acked[d.eventID]
	s.sent++
	s.mu.Unlock()
	deadline := time.Now().Add(deliveryMax)
	backoff := backoffMin
	for {
		status, answer, err := s.post(ctx, d)
		if err == nil && definitive(status) {
			s.record(d, status, answer, ackedBefore)
			return
		}
		why := fmt.Sprintf("status %d", status)
		if err != nil {
			why = errorClass(err)
		}
		s.mu.Lock()
		s.retried[why]++
		s.mu.Unlock()
		if status == http.StatusInternalServerError {
			s.anomaly("%s %s: 500 (the contract answers a storage outage with 503)", d.kind, d.eventID)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.mu.Lock()
			s.undeliv = append(s.undeliv, fmt.Sprintf("%s %s (last: %s)", d.kind, d.eventID, why))
			s.mu.Unlock()
			return
		}
		select {
		case <-time.After(backoff/2 + rand.N(backoff/2)):
		case <-ctx.Done():
		}
		backoff = min(backoff*2, backoffMax)
	}
}

// definitive: what a provider takes as the final word on a delivery.
func definitive(status int) bool {
	return status >= 200 && status < 500 && status != http.StatusTooManyRequests && status != http.StatusRequestTimeout
}

func errorClass(err error) string {
	msg := err.Error()
	for _, class := range []string{"connection refused", "connection reset", "EOF", "Client.Timeout", "broken pipe"} {
		if strings.Contains(msg, class) {
			return class
		}
	}
	return "transport error"
}

func (s *sender) record(d delivery, status int, answer string, ackedBefore bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers[fmt.Sprintf("%s %d %s", d.kind, status, answer)]++
	expected := false
	for _, want := range d.expect {
		expected = expected || want == status
	}
	if !expected {
		s.anomalyLocked("%s %s (%s): got %d %q, want %v", d.kind, d.eventID, d.label, status, answer, d.expect)
		return
	}
	if status != http.StatusOK {
		return
	}
	switch answer {
	case "accepted":
		s.accepted[d.eventID]++
		if s.accepted[d.eventID] > 1 {
			s.anomalyLocked("%s %s: accepted a second time", d.kind, d.eventID)
		}
		if ackedBefore {
			// The api had answered 200 for this event before this
			// delivery began: storing it again means the first was lost.
			s.anomalyLocked("%s %s: accepted although acknowledged before (was it lost?)", d.kind, d.eventID)
		}
	case "duplicate":
	default:
		s.anomalyLocked("%s %s: 200 with status %q", d.kind, d.eventID, answer)
		return
	}
	if _, ok := s.acked[d.eventID]; !ok {
		s.acked[d.eventID] = time.Now()
	}
}

func (s *sender) anomaly(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.anomalyLocked(format, args...)
}

func (s *sender) anomalyLocked(format string, args ...any) {
	s.anomalous++
	if len(s.anomalies) < anomalySamples {
		s.anomalies = append(s.anomalies, fmt.Sprintf(format, args...))
	}
}

func (s *sender) post(ctx context.Context, d delivery) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.apiURL+"/webhook/payments", bytes.NewReader(d.body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	secret := harness.WebhookSecret
	if d.badSig {
		secret += "-wrong"
	}
	req.Header.Set("X-Signature", harness.Sign(d.body, secret))
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, responseBytesMax))
	if err != nil {
		// The status line came, the body did not: not an answer.
		return 0, "", err
	}
	var answer struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(data, &answer)
	return resp.StatusCode, answer.Status, nil
}

// summary is the sender's account of the run.
func (s *sender) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "events planned %d, deliveries %d, events acknowledged %d\n", len(s.events), s.sent, len(s.acked))
	b.WriteString("answers:")
	for _, k := range sortedKeys(s.answers) {
		fmt.Fprintf(&b, " [%s]=%d", k, s.answers[k])
	}
	b.WriteString("\nredelivered because:")
	for _, k := range sortedKeys(s.retried) {
		fmt.Fprintf(&b, " [%s]=%d", k, s.retried[k])
	}
	b.WriteString("\n")
	return b.String()
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
