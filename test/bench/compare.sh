#!/usr/bin/env bash
# Runs every figure of BENCHMARKS.md in one sitting, so the ratios against
# the seed design compare runs taken on the same machine in the same state.
# Usage: test/bench/compare.sh [output-dir]   (from the repository root)
# SEED_DIR points at the seed-celery reproduction (default ../shared/peers/seed-celery).
set -euo pipefail

out=${1:-$(mktemp -d /tmp/settle-bench.XXXX)}
mkdir -p "$out"
seed=${SEED_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)/shared/peers/seed-celery}
quiet=${WAIT_QUIET:-600}

step() { printf '\n=== %s\n$ %s\n' "$1" "${*:2}" | tee -a "$out/all.txt"; "${@:2}" 2>&1 | tee "$out/$1.txt" | tee -a "$out/all.txt"; }
e2e() { go test ./test/bench -run '^$' -bench EndToEnd -benchtime 1x -timeout 30m "$@"; }

go test -c -o /dev/null ./test/bench # build once, outside every measured window

step e2e-deposits e2e -e2e.events 20000 -e2e.duplicates 20
step e2e-steady-100 e2e -e2e.events 3000 -e2e.rate 120 -e2e.concurrency 16
step e2e-withdrawals e2e -e2e.events 5000 -e2e.withdrawals 100 -e2e.users 100 -e2e.initial-balance 100 -e2e.duplicates 10 -e2e.workers 2
# The same contention through holds: every event a hold, then its post (3 in 4) or void, so twice the events.
step e2e-holds e2e -e2e.events 5000 -e2e.holds 100 -e2e.users 100 -e2e.initial-balance 100 -e2e.duplicates 10 -e2e.workers 2
step e2e-backlog-100k e2e -e2e.events 100000 -e2e.duplicates 0 -e2e.backlog
step pgbench-seed-sql go test ./test/bench -run '^$' -bench PgbenchSeedSQL -benchtime 1x -pgbench.seed-dir "$seed"
step ingest go test ./pkg/httpapi -run '^$' -bench WebhookIngest -benchtime 5000x
if [ -x "$seed/bench.sh" ]; then
	step seed-deposits bash -c "cd '$seed' && ./bench.sh --runs 3 --wait-quiet $quiet --max-other-pct 10"
	step seed-withdrawals bash -c "cd '$seed' && ./bench.sh --withdraw --wait-quiet $quiet --max-other-pct 10"
fi
echo "results in $out"
