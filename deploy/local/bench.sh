#!/usr/bin/env bash
# Runs the benchmark harness (test/bench) on real services: Redis with AOF everysec (16379), a
# second Redis without persistence (16380) for the AOF comparison, and Kafka; then the Go
# micro-benchmarks. Stops whatever it started. The harness reads (BENCHMARKS.md, How to run):
#   BENCH_EVENTS      events of the today and wide shapes (default 1 000 000)
#   BENCH_SUITE_RUNS  graded runs the eval shape's suite version grows to (default 1 000 000)
#   BENCH_SHAPES      which shapes to run, comma-separated (default today,wide,eval)
#   BENCH_BASELINE    an older repeatrate binary or a git revision to build: every pipeline run
#                     alternates it with the working tree's build, and the figures gain ratios
#   BENCH_ROUNDS      runs per configuration and build, the faster kept (default 2)
#   BENCH_TIMEOUT     per pipeline run (default 30m); a run cut short reports what it processed
#   BENCH_CLUSTER=1   instead: 1, 2 and 3 processors on the local Redis Cluster and three brokers
#                     (started here and stopped afterwards when they were not running)
#   BENCH_ISOLATION=1 instead: a normal tenant alone and beside an abusive one, with the default
#                     limits and with them lifted (BENCH_ISOLATION_SECONDS per phase, default 30;
#                     BENCH_ISOLATION_LIMITS=default or lifted runs one; BENCH_ISOLATION_ABUSE names
#                     the abuses, of reads,streams,ingest; BENCH_ISOLATION_WORKSPACE_RATE sets the
#                     per-workspace ingest quota)
#   BENCH_PREFILL=N   instead: the today stream on an empty store and on one already retaining N
#                     opportunities over 10 000 aggregates, in BENCH_PREFILL_ROUNDS rounds (3)
#                     (docs/performance.md); BENCH_PREFILL_CONTROL=1 adds a store holding only
#                     what the prefill put in the stream's own aggregates; BENCH_PREFILL_WARM=W
#                     has every run's processor run W more events of its stream before measuring
#   BENCH_LATENCY_RATE=R  instead: produce → snapshot latency alone, at R events/s, with where a
#                     batch's time goes (the processor's stage histograms)
set -euo pipefail
cd "$(dirname "$0")/../.."
here=deploy/local

started=()
cleanup() {
  local rc=$?
  for s in "${started[@]}"; do
    case "$s" in
      redis-noaof) REDIS_PORT=16380 "$here/redis.sh" stop >/dev/null 2>&1 || true ;;
      *) "$here/$s.sh" stop >/dev/null 2>&1 || true ;;
    esac
  done
  exit $rc
}
trap cleanup EXIT INT TERM

if [ "${BENCH_CLUSTER:-}" = 1 ]; then
  for s in redis-cluster kafka-cluster; do
    if ! "$here/$s.sh" status >/dev/null 2>&1; then "$here/$s.sh" start; started+=("$s"); fi
  done
  echo "== cluster harness (BENCH_EVENTS=${BENCH_EVENTS:-1000000} BENCH_ROUNDS=${BENCH_ROUNDS:-2})"
  go run ./test/bench
  exit
fi
for s in redis kafka; do
  if ! "$here/$s.sh" status >/dev/null 2>&1; then "$here/$s.sh" start; started+=("$s"); fi
done
if ! REDIS_PORT=16380 "$here/redis.sh" status >/dev/null 2>&1; then
  REDIS_PORT=16380 REDIS_AOF=no "$here/redis.sh" start
  started+=("redis-noaof")
fi
export REPEATRATE_TEST_REDIS=127.0.0.1:16379 REPEATRATE_TEST_KAFKA=127.0.0.1:19092 BENCH_REDIS_NOAOF=127.0.0.1:16380

if [ -n "${BENCH_PREFILL:-}" ]; then
  echo "== prefilled store (BENCH_PREFILL=$BENCH_PREFILL opportunities, BENCH_EVENTS=${BENCH_EVENTS:-1000000})"
  go run ./test/bench
  exit
fi
if [ -n "${BENCH_LATENCY_RATE:-}" ]; then
  echo "== produce → snapshot latency at BENCH_LATENCY_RATE=$BENCH_LATENCY_RATE events/s"
  go run ./test/bench
  exit
fi
if [ "${BENCH_ISOLATION:-}" = 1 ]; then
  echo "== tenant isolation (BENCH_ISOLATION_SECONDS=${BENCH_ISOLATION_SECONDS:-30})"
  go run ./test/bench
  exit
fi

echo "== Go micro-benchmarks"
go test -run '^$' -bench . -benchmem -benchtime 2s ./consumer ./aggregator
echo "== end-to-end harness (BENCH_EVENTS=${BENCH_EVENTS:-1000000} BENCH_SUITE_RUNS=${BENCH_SUITE_RUNS:-1000000} BENCH_SHAPES=${BENCH_SHAPES:-today,wide,eval}${BENCH_BASELINE:+ BENCH_BASELINE=$BENCH_BASELINE})"
go run ./test/bench
