// Package postgres is settle's storage: the outbox, the ledger, the DLQ
// and the maintenance queries, on PostgreSQL through pgx. No other package
// imports pgx.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/settle/settle/pkg/payment"
)

// Options tune the pool; zero values take the defaults.
type Options struct {
	// ConnsMax bounds the pool (pgxpool's pool_max_conns in the URL wins).
	ConnsMax int32
	// ApplicationName shows up in pg_stat_activity.
	ApplicationName string
}

// Open's patience with a PostgreSQL that is not up yet; the caller's
// context bounds it.
const (
	openWaitMax      = time.Minute // when the caller sets no deadline
	openPingTimeout  = 5 * time.Second
	openBackoffFirst = 100 * time.Millisecond
	openBackoffMax   = 2 * time.Second
)

// DB is a connection pool plus the statements that run on it.
type DB struct {
	pool *pgxpool.Pool
	// knownBalances remembers (user, asset) pairs whose balance row exists,
	// so the ledger skips creating them; rows are never deleted.
	knownBalances boundedSet
}

// knownBalancesMax bounds the remembered pairs; past it the set starts
// over (a forgotten pair costs one harmless INSERT ... ON CONFLICT).
const knownBalancesMax = 200_000

// boundedSet is a set that forgets everything when it grows too large.
type boundedSet struct {
	mu   sync.Mutex
	keys map[any]struct{}
}

func (b *boundedSet) Load(k any) (struct{}, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.keys[k]
	return v, ok
}

func (b *boundedSet) Delete(k any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.keys, k)
}

func (b *boundedSet) Store(k any, v struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.keys == nil || len(b.keys) >= knownBalancesMax {
		b.keys = map[any]struct{}{}
	}
	b.keys[k] = v
}

// errNotConnString is CheckURL's answer when the driver's own words
// cannot be told apart from the string.
var errNotConnString = errors.New("not a PostgreSQL connection URL or key=value string")

// CheckURL says whether url is a connection string Open accepts (pool
// settings included), without connecting. Its error says what is wrong and
// never repeats the string, which may hold a password: the driver masks
// it, but only as best it can.
func CheckURL(url string) error {
	_, err := pgxpool.ParseConfig(url)
	if err == nil {
		return nil
	}
	// The driver says "cannot parse `<the string, masked>`: <what is
	// wrong>"; only the last part is kept, unless the string shows there.
	var parseErr *pgconn.ParseConfigError
	text := err.Error()
	i := strings.LastIndex(text, "`: ")
	if !errors.As(err, &parseErr) || i < 0 || strings.Contains(text[i:], url) {
		return errNotConnString
	}
	// The words may still quote a piece of the string: the word after a
	// space in an unquoted password (`missing "=" after "<word>"`).
	return errors.New(quotedPieces.ReplaceAllStringFunc(text[i+len("`: "):], func(q string) string {
		piece, err := strconv.Unquote(q)
		if err == nil && (len(piece) < 2 || !strings.Contains(url, piece)) {
			return q // the driver's own ("=") or not from the string
		}
		return `"[redacted]"`
	}))
}

// quotedPieces are the %q strings of the driver's words.
var quotedPieces = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// Open connects and waits, within ctx, until PostgreSQL answers. The URL may carry any
// pgx setting; behind PgBouncer in transaction pooling, add
// default_query_exec_mode=cache_describe (see README, "PgBouncer").
func Open(ctx context.Context, url string, opts Options) (*DB, error) {
	config, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if opts.ConnsMax > 0 && !hasParam(url, "pool_max_conns") {
		config.MaxConns = opts.ConnsMax
	}
	if opts.ApplicationName != "" && config.ConnConfig.RuntimeParams["application_name"] == "" {
		config.ConnConfig.RuntimeParams["application_name"] = opts.ApplicationName
	}
	if config.ConnConfig.ConnectTimeout == 0 {
		config.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	// A connection that sat idle is pinged before use (pgxpool's default
	// past one second idle); one released inside a transaction is closed by
	// pgxpool rather than reused.
	config.PingTimeout = 2 * time.Second
	config.HealthCheckPeriod = 15 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	db := &DB{pool: pool}
	if _, bounded := ctx.Deadline(); !bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, openWaitMax)
		defer cancel()
	}
	// PostgreSQL may still be starting (or failing over) when a binary
	// starts: keep trying with backoff until the caller's deadline rather
	// than leave it to the orchestrator's restart loop.
	backoff := openBackoffFirst
	var last error
	for {
		pingCtx, cancel := context.WithTimeout(ctx, openPingTimeout)
		err := pool.Ping(pingCtx)
		cancel()
		if err == nil {
			return db, nil
		}
		if last == nil || ctx.Err() == nil {
			// A try cut short by the end itself says nothing of the
			// server: the one before it does.
			last = err
		}
		select {
		case <-ctx.Done():
			pool.Close()
			// Both: callers tell a stop (canceled) from an outage by the
			// first, operators need the second.
			return nil, fmt.Errorf("connect: %w (last try: %w)", ctx.Err(), last)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, openBackoffMax)
	}
}

// Close releases every connection.
func (db *DB) Close() { db.pool.Close() }

// Ping checks that PostgreSQL answers.
func (db *DB) Ping(ctx context.Context) error { return db.pool.Ping(ctx) }

// Stats exposes the pool's counters for metrics.
func (db *DB) Stats() *pgxpool.Stat { return db.pool.Stat() }

func hasParam(url, name string) bool { return strings.Contains(url, name+"=") }

// PostgreSQL error codes settle reacts to.
const (
	codeUniqueViolation     = "23505"
	codeForeignKeyViolation = "23503"
	codeCheckViolation      = "23514"
	codeLockNotAvailable    = "55P03"
	codeQueryCanceled       = "57014" // statement_timeout
	codeDeadlockDetected    = "40P01"
	codeSerializationFail   = "40001"
	codeUndefinedTable      = "42P01"
	codeUndefinedColumn     = "42703"
	codeUndefinedFunction   = "42883"
	codeAdminShutdown       = "57P01"
	// The session was ended for idling in its transaction (the ledger's
	// bound): rolled back, no fault of an event.
	codeIdleInTxTimeout  = "25P03"
	codeCannotConnectNow = "57P03"
	// Errors a connection pooler in front of PostgreSQL answers with when
	// it is misconfigured or restarting: the database is not the problem.
	codeInvalidStatementName = "26000"
	codeDuplicatePrepared    = "42P05"
	codeProtocolViolation    = "08P01"
)

// classifyTx classifies what a transaction function returned when BEGIN
// or COMMIT failed for an outage or a retryable reason; anything else
// came classified from inside the transaction and passes as it is.
func classifyTx(op string, err error) error {
	if c := classify(op, err); errors.Is(c, payment.ErrRetryable) || errors.Is(c, payment.ErrUnavailable) {
		return c
	}
	return err
}

// classify maps a driver error to the domain's kinds. Lock and statement
// timeouts, deadlocks and serialisation failures are retryable. An error
// the server did not send (no *pgconn.PgError: a refused, reset or closed
// connection, a timeout on the wire) is an outage, and so is a schema
// behind the binary (SchemaMismatch). A server error passes through with
// its operation attached.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, payment.ErrRetryable) || errors.Is(err, payment.ErrUnavailable) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeLockNotAvailable, codeQueryCanceled, codeDeadlockDetected, codeSerializationFail:
			return payment.Retryable(op, err)
		case codeAdminShutdown, codeIdleInTxTimeout, codeCannotConnectNow, codeInvalidStatementName, codeDuplicatePrepared, codeProtocolViolation:
			return payment.Unavailable(op, err)
		case codeUndefinedTable, codeUndefinedColumn, codeUndefinedFunction:
			// A migration not applied yet: no event is at fault, and
			// dead-lettering money events for it would need a replay of
			// each. The statement fails for every event alike, so this
			// never lets one poison event retry forever; callers alert
			// while it lasts (SchemaMismatch), since a wrong statement
			// would look the same.
			return payment.Unavailable(op, err)
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	if unreachable(err) {
		return payment.Unavailable(op, err)
	}
	// Anything else (a Scan that does not fit, a bug, a caller gone) is
	// internal: it spends the event's retries and reaches the DLQ. An
	// outage must be proven, or a poison event would retry forever.
	return fmt.Errorf("%s: %w", op, err)
}

// unreachable tells whether err proves that PostgreSQL could not be
// reached or stopped answering: a refused, reset or timed out
// connection, or one the driver says is safe to retry elsewhere.
func unreachable(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connectErr), errors.As(err, &netErr),
		errors.Is(err, pgconn.ErrConnClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err), pgconn.SafeToRetry(err):
		return true
	}
	return false
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

func isUndefinedTable(err error) bool { return isCode(err, codeUndefinedTable) }

// Contention reports whether err is PostgreSQL giving up on a statement
// that waited or raced for what others hold: a lock or statement timeout,
// a deadlock, a serialisation failure (the codes classify makes
// retryable). A lock held by a migration or an operator's DDL fails every
// event that needs the table alike, so the worker retries these for a
// while without spending the budget (worker.WorkerOptions.ContentionWindow).
func Contention(err error) bool {
	return isCode(err, codeLockNotAvailable) || isCode(err, codeQueryCanceled) ||
		isCode(err, codeDeadlockDetected) || isCode(err, codeSerializationFail)
}

// SchemaMismatch reports whether err is PostgreSQL refusing a statement
// for a table, column or function (or operator) the database lacks:
// migrations not applied yet, or a statement that is wrong. classify
// makes it unavailable, so it retries instead of dead-lettering.
func SchemaMismatch(err error) bool {
	return isCode(err, codeUndefinedTable) || isCode(err, codeUndefinedColumn) || isCode(err, codeUndefinedFunction)
}

// txIdleMax bounds how long a transaction waits for its client between
// statements (a variable so a test can shorten it). Between two
// statements settle's code only works in memory: a client idle that long
// in its transaction is frozen or cut off (a paused VM, a lost node: its
// socket neither answers nor resets), and PostgreSQL ends its session,
// releasing its row and advisory locks, instead of keeping them until
// its kernel gives the socket up, hours later. The ledger bounds its own
// (ledgerSettings); the migration lock's transaction waits for its
// migration on purpose and is not bounded.
var txIdleMax = 10 * time.Second

// begin opens a transaction bounded by txIdleMax.
func (db *DB) begin(ctx context.Context) (pgx.Tx, error) {
	return db.pool.BeginTx(ctx, bounded(pgx.TxOptions{}))
}

// rollbackDetached ends tx even when ctx is gone (so its connection goes
// back to the pool whole), within rollbackTimeout: a link that froze
// after the last statement closes the connection instead of holding the
// caller until TCP gives up.
func rollbackDetached(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// bounded is o with BEGIN and the bound sent together: one round trip,
// as BEGIN alone, and SET LOCAL ends with the transaction (PgBouncer's
// transaction pooling keeps nothing of it).
func bounded(o pgx.TxOptions) pgx.TxOptions {
	begin := "BEGIN"
	if o.IsoLevel != "" {
		begin += " ISOLATION LEVEL " + string(o.IsoLevel)
	}
	if o.AccessMode != "" {
		begin += " " + string(o.AccessMode)
	}
	if o.DeferrableMode != "" {
		begin += " " + string(o.DeferrableMode)
	}
	o.BeginQuery = fmt.Sprintf("%s; SET LOCAL idle_in_transaction_session_timeout = '%s'", begin, durationSetting(txIdleMax))
	return o
}

// querier is what a statement runs on: the pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
