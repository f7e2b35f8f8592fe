#!/usr/bin/env bash
# A BENCH_BASELINE script (docs/performance.md): runs a repeatrate binary as the harness asks,
# with the example alerting rules, after filling the run's snapshot topic with the snapshots of
# BENCH_ALERT_AGGREGATES (default 100 000) other aggregates, so that its evaluator holds that
# many beside the shape's. Against the plain binary in the same run, it measures what alerting
# over that many aggregates costs consumption (BENCHMARKS.md, Alerting):
#
#   go build -o bin/repeatrate ./cmd/repeatrate
#   BENCH_BASELINE=test/bench/with-alerting.sh BENCH_SHAPES=today make bench
#
# BENCH_ALERTING_BIN names the binary (default bin/repeatrate). BENCH_ALERTING=beside runs the
# evaluator as `repeatrate alert` beside a plain processor instead, started 20 s before it, so that
# its catch-up of the held snapshots is over and the run measures its steady cost (it ends itself
# after BENCH_ALERTING_SECONDS, default 300).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${BENCH_ALERTING_BIN:-$root/bin/repeatrate}
n=${BENCH_ALERT_AGGREGATES:-100000}
file=$(mktemp)
trap 'rm -f "$file"' EXIT
python3 - "$n" >"$file" <<'PY'
import datetime, json, sys
n = int(sys.argv[1])
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
for i in range(n):
    w = {"confirmed_repeats": 3, "passed": 297, "unscored": 0, "scored": 300, "rate": 0.01,
         "percentage": 1.0, "status": "measured", "ci95": {"low": 0.003, "high": 0.03}}
    week = dict(w, confirmed_repeats=20, passed=1980, scored=2000)
    src = "live" if i % 2 == 0 else "evaluation"
    snap = {"aggregate": {"workspace": "held-%d" % (i // 2000), "model": "m", "run": "r", "checkpoint": "c",
                          "artifact": "prod", "correction_id": "fix-%06d" % (i // 2), "source": src},
            "windows": {"all": week, "1h": w, "24h": w, "7d": week},
            "opportunity_window": None, "observed_at": now, "version": 1}
    print(json.dumps({"specversion": "1.0", "id": "held-%d" % i, "source": "urn:repeatrate",
                      "type": "repeatrate.snapshot.v1", "data": snap}, separators=(",", ":")))
PY
"$bin" produce --brokers "$REPEATRATE_KAFKA_BROKERS" --topic "$REPEATRATE_KAFKA_SNAPSHOT_TOPIC" --in "$file" >/dev/null
rules="$root/deploy/alert-rules.example.yaml"
if [ "${BENCH_ALERTING:-inside}" = beside ]; then
  timeout "${BENCH_ALERTING_SECONDS:-300}" "$bin" alert --http-addr= --alert-rules "$rules" >/dev/null 2>&1 &
  sleep 20
  exec "$bin" "$@"
fi
exec "$bin" "$@" --alert-rules "$rules"
