// Package bench measures settle end to end: throughput, latency, CPU
// milliseconds per event summed over every process (ours, PostgreSQL,
// Redis; read from /proc by pkg/loadgen) and peak memory, idle CPU, next
// to pgbench runs of the seed design's per-event SQL. See BENCHMARKS.md
// for the commands.
package bench
