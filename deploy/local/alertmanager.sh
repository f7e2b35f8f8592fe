#!/usr/bin/env bash
# Starts or stops a local Prometheus Alertmanager for the alerting tests: Debian's
# prometheus-alertmanager on loopback, clustering off, one receiver that sends nothing, data under
# .cache/alertmanager (port 19193: the local Kafka's controller listens on 19093). Idempotent: "start" on a running Alertmanager is a no-op.
# Usage: deploy/local/alertmanager.sh start|stop|status   (ALERTMANAGER_PORT, default 19193)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
port=${ALERTMANAGER_PORT:-19193}
dir="$root/.cache/alertmanager/$port"
pidfile="$dir/alertmanager.pid"
bin=prometheus-alertmanager

ready() { curl -fsS "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1; }

install() {
  command -v "$bin" >/dev/null && return
  echo "alertmanager.sh: installing prometheus-alertmanager with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq prometheus-alertmanager >/dev/null 2>&1 || {
    apt-get update -qq
    apt-get install -y -qq prometheus-alertmanager >/dev/null
  }
}

case "${1:-}" in
start)
  install
  if ready; then echo "alertmanager.sh: already running on 127.0.0.1:$port"; exit 0; fi
  mkdir -p "$dir/data"
  cat >"$dir/alertmanager.yml" <<'YAML'
route:
  receiver: blackhole
  group_wait: 1s
  group_interval: 1s
receivers:
  - name: blackhole
YAML
  nohup "$bin" --config.file="$dir/alertmanager.yml" --storage.path="$dir/data" \
    --web.listen-address="127.0.0.1:$port" --cluster.listen-address= \
    >"$dir/alertmanager.log" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 1 100); do ready && { echo "alertmanager.sh: up on 127.0.0.1:$port"; exit 0; }; sleep 0.1; done
  echo "alertmanager.sh: alertmanager did not answer on port $port; log follows" >&2
  tail -n 20 "$dir/alertmanager.log" >&2 || true
  exit 1
  ;;
stop)
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    pid=$(cat "$pidfile")
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "alertmanager.sh: stopped"
  fi
  rm -rf "$dir"
  ;;
status)
  ready && echo "alertmanager.sh: running on 127.0.0.1:$port" || { echo "alertmanager.sh: not running"; exit 1; }
  ;;
*)
  echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
