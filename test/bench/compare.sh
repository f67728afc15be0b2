#!/usr/bin/env bash
# Runs every figure of BENCHMARKS.md (the targets of issue 19 and the seed
# baselines) in one sitting, so the ratios against the seed design compare
# runs taken on the same machine in the same state, and ends with a summary
# of every target beside its figure.
# Usage: test/bench/compare.sh [output-dir]   (from the repository root)
# SEED_DIR points at the seed-celery reproduction (default ../shared/peers/seed-celery).
# BACKLOG_EVENTS sizes the memory run (default 1000000: about half an hour);
# ONLY="name name" runs only those steps into an existing output dir (the
# summary then reads the others' earlier outputs); SKIP_SEED=1 leaves out
# the seed's own runs; on a shared machine
# WAIT_QUIET=0 SEED_MAX_OTHER=0 runs them at once (CPU ms/event is the
# figure that load moves least). RUNS (default 3) repeats each end-to-end
# run but the backlog, and the summary gives each figure's median beside
# every run's, as the seed's own benchmark does: this host's speed moves by
# up to 2x within the hour.
set -euo pipefail

out=${1:-$(mktemp -d /tmp/settle-bench.XXXX)}
mkdir -p "$out"
seed=${SEED_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)/shared/peers/seed-celery}
quiet=${WAIT_QUIET:-600}      # the seed's runs wait up to this long for a quiet machine
maxother=${SEED_MAX_OTHER:-10} # and repeat a run when others took more than this % (0: never)
backlog=${BACKLOG_EVENTS:-1000000}
runs=${RUNS:-3}

failed=()
# step NAME COMMAND...: runs one measurement; a failed one is named in the
# summary and the sitting goes on.
step() {
	if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $1 "* ]]; then return 0; fi
	printf '\n=== %s\n$ %s\n' "$1" "${*:2}" | tee -a "$out/all.txt"
	set +e
	"${@:2}" 2>&1 | tee "$out/$1.txt" | tee -a "$out/all.txt"
	local rc=${PIPESTATUS[0]}
	set -e
	if [ "$rc" -ne 0 ]; then
		echo "=== $1 failed (exit $rc)" | tee -a "$out/all.txt"
		failed+=("$1")
	fi
}
e2e() { go test ./test/bench -run '^$' -bench EndToEnd -benchtime 1x -timeout 90m "$@"; }
# e2e runs, each RUNS times (a fresh system every time).
e2es() { e2e -count "$runs" "$@"; }

go test -c -o /dev/null ./test/bench # build once, outside every measured window
uptime | tee -a "$out/all.txt"

step idle go test ./test/bench -run '^$' -bench Idle -benchtime 1x -timeout 10m -idle.window 60s
# -e2e.rate counts webhooks, duplicates included: 120/s is 100 new events/s.
step e2e-steady-100 e2es -e2e.events 6000 -e2e.rate 120 -e2e.concurrency 16
# The same hops as a deposit at 100/s with nothing in them: what the path costs on this host.
step trickle-floor go test ./test/bench -run '^$' -bench TrickleFloor -benchtime 1x -count "$runs" -floor.events 6000 -floor.rate 120
# The queue's share of a trickle event (what a plainer queue could save at
# most): the same hops on one P (as settle's processes run at a trickle),
# once with a plain Redis list and once through settle's own asynq path.
floor1p() { go test ./test/bench -run '^$' -bench TrickleFloor -benchtime 1x -count "$runs" -floor.events 6000 -floor.rate 120 -floor.gomaxprocs 1 "$@"; }
step trickle-floor-list-1p floor1p -floor.queue list
step trickle-floor-asynq-1p floor1p -floor.queue asynq
step e2e-deposits e2es -e2e.events 20000 -e2e.duplicates 20
# 20,000 events as for deposits (5,000 until session 18: a window of 1-2 s,
# ramp and tail included); 400 per user keeps a third of them short of funds.
step e2e-withdrawals e2es -e2e.events 20000 -e2e.withdrawals 100 -e2e.users 100 -e2e.initial-balance 400 -e2e.duplicates 10 -e2e.workers 2
# The same contention through holds: every event a hold, then its post (3 in 4) or void, so twice the events.
step e2e-holds e2es -e2e.events 20000 -e2e.holds 100 -e2e.users 100 -e2e.initial-balance 400 -e2e.duplicates 10 -e2e.workers 2
scanner=$(grep -rl --include='*_test.go' -E '^func Benchmark(Chain)?Scan' pkg cmd test 2>/dev/null | head -1 || true)
if [ -n "$scanner" ]; then
	step scanner go test "./$(dirname "$scanner")" -run '^$' -bench '^Benchmark(Chain)?Scan' -benchtime 1x -timeout 30m
else
	printf '\n=== scanner\nno scanner benchmark in this tree: not measured\n' | tee "$out/scanner.txt" | tee -a "$out/all.txt"
fi
step pgbench-seed-sql go test ./test/bench -run '^$' -bench PgbenchSeedSQL -benchtime 1x -pgbench.seed-dir "$seed"
step ingest go test ./pkg/httpapi -run '^$' -bench WebhookIngest -benchtime 5000x
if [ -x "$seed/bench.sh" ] && [ "${SKIP_SEED:-}" != 1 ]; then
	step seed-deposits bash -c "cd '$seed' && ./bench.sh --runs 3 --wait-quiet $quiet --max-other-pct $maxother"
	step seed-withdrawals bash -c "cd '$seed' && ./bench.sh --withdraw --wait-quiet $quiet --max-other-pct $maxother"
fi
step e2e-backlog e2e -e2e.events "$backlog" -e2e.duplicates 0 -e2e.backlog

# values FILE UNIT: the value before UNIT on each of the file's result
# lines (one per run), in run order. With -count above 1 go test prints a
# run's name before the run's own output, so only the first result line
# starts with it: a result line is one with ns/op (or, as BenchmarkIdle's
# reports none, one that starts with the name).
values() { awk -v unit="$2" '/^Benchmark| ns\/op/ { for (i = 2; i <= NF; i++) if ($i == unit) print $(i-1) }' "$out/$1.txt" 2>/dev/null || true; }
# median: of the numbers on stdin, one a line (the lower middle of an
# even count; - for none).
median() {
	local v n
	v=$(sort -g)
	[ -n "$v" ] || { echo -; return; }
	n=$(wc -l <<<"$v")
	sed -n "$(((n + 1) / 2))p" <<<"$v"
}
# metric FILE UNIT: their median.
metric() { values "$1" "$2" | median; }
# each FILE UNIT [LABEL]: every run's value, when there was more than one.
each() {
	local v
	v=$(values "$1" "$2" | paste -sd' ' -)
	[[ "$v" == *' '* ]] && printf ' (runs: %s%s)' "$v" "${3:+ $3}" || true
}
line() { grep -m1 -E "$2" "$out/$1.txt" 2>/dev/null || echo "-"; }
# proc FILE NAME: the median of NAME's CPU per event over the file's runs
# ("cpu NAME" lines; the end-to-end runs name the first worker worker-0).
proc() { awk -v p="$2" '$1 == "cpu" && ($2 == p || $2 == p "-0") && $4 == "ms/event" { print $3 }' "$out/$1.txt" 2>/dev/null | median; }
# above_floor: each process's steady CPU per event beside the floor's,
# and the difference (settle's own work in that process).
above_floor() {
	local p a b
	for p in api postgres redis worker; do
		a=$(proc e2e-steady-100 "$p") b=$(proc trickle-floor "$p")
		if [ "$a" = - ] || [ "$b" = - ]; then printf '%s -  ' "$p"; continue; fi
		awk -v p="$p" -v a="$a" -v b="$b" 'BEGIN { printf "%s %s-%s=%+.3f  ", p, a, b, a - b }'
	done
}
# queue_share: the one-P floor through asynq against the one through a
# plain list, each as a multiple of its own load generator's CPU (the host
# drifts between the steps), and the difference.
queue_share() {
	local a b
	a=$(metric trickle-floor-asynq-1p x-loadgen) b=$(metric trickle-floor-list-1p x-loadgen)
	if [ "$a" = - ] || [ "$b" = - ]; then echo -; return; fi
	awk -v a="$a" -v b="$b" 'BEGIN { printf "asynq %s - list %s = %+.3f", a, b, a - b }'
}
{
	printf '\n=== summary (issue 19 targets; every figure from this sitting)\n'
	printf '%-44s %-22s %s\n' target wanted measured
	printf '%-44s %-22s %s ms/event%s\n' "100 events/s: CPU, all processes" "<= 2" "$(metric e2e-steady-100 cpu-ms/event)" "$(each e2e-steady-100 cpu-ms/event)"
	printf '%-44s %-22s %s / %s ms%s\n' "100 events/s: webhook-to-terminal p50 / p99" "<= 25 / <= 100" "$(metric e2e-steady-100 p50-ms)" "$(metric e2e-steady-100 p99-ms)" "$(each e2e-steady-100 p99-ms 'ms p99')"
	printf '%-44s %-22s %s ms/event%s\n' "100 events/s: the same hops, nothing in them" "(the host's floor)" "$(metric trickle-floor cpu-ms/event)" "$(each trickle-floor cpu-ms/event)"
	printf '%-44s %-22s %s\n' "100 events/s: settle above the floor" "(ms/event, medians)" "$(above_floor | sed "s/ *$//")"
	printf '%-44s %-22s %s\n' "100 events/s: the queue's share (one P)" "(x load generator)" "$(queue_share)"
	printf '%-44s %-22s %s %% of a core\n' "100 events/s: the hypervisor's steal" "(the host, not settle)" "$(metric e2e-steady-100 steal-core-%)"
	printf '%-44s %-22s %s / %s%s\n' "CPU/event x load generator: 100/s / flat out" "(across hosts)" "$(metric e2e-steady-100 x-loadgen)" "$(metric e2e-deposits x-loadgen)" "$(each e2e-deposits x-loadgen)"
	printf '%-44s %-22s %s %% of a core\n' "idle: api+worker+scheduler+PostgreSQL+Redis" "<= 1" "$(metric idle idle-core-%)"
	printf '%-44s %-22s %s /s at %s ms/event%s%s\n' "full speed: applied deposits" ">= 4500 at <= 0.3" "$(metric e2e-deposits applied/s)" "$(metric e2e-deposits cpu-ms/event)" "$(each e2e-deposits applied/s /s)" "$(each e2e-deposits cpu-ms/event ms)"
	printf '%-44s %-22s %s /s%s\n' "contended withdrawals" ">= 3500" "$(metric e2e-withdrawals applied/s)" "$(each e2e-withdrawals applied/s)"
	printf '%-44s %-22s %s events/s%s\n' "holds + posts/voids" ">= 3500" "$(metric e2e-holds applied/s)" "$(each e2e-holds applied/s)"
	printf '%-44s %-22s %s\n' "scanner, 100k addresses" ">= 500 blocks/s, <= 3 RPC/block" "$(grep -m1 -E '^Benchmark|not measured' "$out/scanner.txt" 2>/dev/null || echo -)"
	printf '%-44s %-22s %s\n' "memory under a $backlog-event backlog" "flat" "$(line e2e-backlog '^peak RSS')"
	printf '%-44s %-22s %s\n' "seed: pgbench of its per-event SQL" "baseline (host speed)" "$(metric pgbench-seed-sql events/s) events/s"
	printf '%-44s %-22s %s\n' "seed: Python/Celery deposits" "baseline" "$(line seed-deposits '^== [0-9]+ runs')"
	printf '%-44s %-22s %s\n' "seed: Python/Celery withdrawals" "baseline" "$(line seed-withdrawals 'throughput')"
	printf 'machine at the end: %s\n' "$(uptime)"
	[ ${#failed[@]} -eq 0 ] || printf 'FAILED steps: %s\n' "${failed[*]}"
} | tee -a "$out/all.txt"
echo "results in $out"
[ ${#failed[@]} -eq 0 ]
