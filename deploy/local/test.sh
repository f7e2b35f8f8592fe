#!/usr/bin/env bash
# Runs the whole test suite against real services: installs and starts Redis, Apache Kafka and
# Alertmanager on loopback (deploy/local/redis.sh, kafka.sh, alertmanager.sh), runs `go test`, and stops whatever this
# script started, also when the tests fail or are interrupted. Services that were already running
# are used and left running.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=deploy/local

# go.mod and go.sum must be what `go mod tidy` makes of the imports: fail (and show the difference)
# before starting anything when they are not.
if ! go mod tidy -diff; then
  echo "go.mod/go.sum are not tidy: run 'go mod tidy' and commit the result" >&2
  exit 1
fi

started=()
cleanup() {
  local rc=$?
  for s in "${started[@]}"; do "$here/$s.sh" stop >/dev/null 2>&1 || true; done
  exit $rc
}
trap cleanup EXIT INT TERM

for s in redis kafka alertmanager; do
  if ! "$here/$s.sh" status >/dev/null 2>&1; then
    "$here/$s.sh" start
    started+=("$s")
  else
    echo "$s: already running, using it"
  fi
done

export REPEATRATE_TEST_REDIS=127.0.0.1:${REDIS_PORT:-16379}
export REPEATRATE_TEST_KAFKA=127.0.0.1:${KAFKA_PORT:-19092}
export REPEATRATE_TEST_ALERTMANAGER=127.0.0.1:${ALERTMANAGER_PORT:-19193}
go vet ./...
# Headless Chromium for the browser test (readside/browser_test.go; it fails without one under CI=true).
if ! command -v chromium >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
fi
# promtool (Debian's prometheus package) validates the example Prometheus rules and runs their unit
# tests (deploy/prometheus; deploy/metrics_test.go checks their metrics against the code).
if ! command -v promtool >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq prometheus >/dev/null; }
fi
promtool check rules deploy/prometheus/repeatrate-rules.yaml
promtool test rules deploy/prometheus/repeatrate-rules.test.yaml
# The Kubernetes manifests, validated offline: kubeconform (Go module proxy) with the strict schemas
# vendored in deploy/k8s/schemas (no schema download); a misspelt field must fail it.
kubeconform=$(go env GOPATH)/bin/kubeconform
[ -x "$kubeconform" ] || go install github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0
schemas='deploy/k8s/schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json'
"$kubeconform" -strict -summary -schema-location "$schemas" deploy/k8s/*.yaml
if sed 's/maxSkew:/maxskew:/' deploy/k8s/repeatrate.yaml | "$kubeconform" -strict -schema-location "$schemas" - >/dev/null 2>&1; then
  echo "kubeconform accepted a misspelt field: the schemas are not strict" >&2; exit 1
fi
# The Python venv of the OpenCompass oracle and the Inspect AI logs (made once, then reused).
test/pyenv.sh
"${REPEATRATE_TEST_VENV:-.cache/venv}/bin/python" test/inspect/make_logs.py .cache/inspect-logs
# What lm-evaluation-harness writes, run offline in its own venv (.cache/lmeval-venv).
test/lmeval/make_samples.sh .cache/lmeval-out
if [ $# -gt 0 ]; then
  go test -count=1 -timeout 40m "$@"
  exit
fi
# Every package but the fault suite, then the fault suite alone: it kills and restarts the shared
# Redis and Kafka, so nothing else may run beside it.
go test -count=1 -timeout 30m $(go list ./... | grep -v -e /test/faults -e /test/cluster -e /test/secure)
# The secured services (Redis with TLS and the least-privilege ACL user, Kafka SASL_SSL with
# SCRAM-SHA-512; deploy/local/secure.sh) and the tests that run every subcommand against them.
if ! "$here/secure.sh" status >/dev/null 2>&1; then
  "$here/secure.sh" start
  started+=("secure")
fi
go test -count=1 -timeout 10m -v ./test/secure
# Stopped before the fault suite (one broker less in memory); stopping again at exit is a no-op.
if [[ " ${started[*]} " == *" secure "* ]]; then "$here/secure.sh" stop >/dev/null; fi
# The browser test's screenshots (git-ignored test artifacts).
ls -1 "$PWD"/test-artifacts/browser/*.png 2>/dev/null | sed 's/^/screenshot: /' || true
go test -count=1 -timeout 40m -p 1 -v ./test/faults
# The cluster tests: a Redis Cluster (3 primaries, 3 replicas) and 3 Kafka brokers of their own,
# on their own ports, stopped afterwards like the services above.
for s in redis-cluster kafka-cluster; do
  if ! "$here/$s.sh" status >/dev/null 2>&1; then
    "$here/$s.sh" start
    started+=("$s")
  fi
done
go test -count=1 -timeout 15m -p 1 -v ./test/cluster
