#!/usr/bin/env bash
# Starts or stops a local Redis for tests: Debian's redis-server on loopback, AOF on
# (appendfsync everysec), data under .cache/redis. Idempotent: "start" on a running server is a no-op.
# "crash" SIGKILLs the server and keeps its data: a later "start" recovers from the AOF.
# Usage: deploy/local/redis.sh start|stop|crash|status   (REDIS_PORT, default 16379;
#        REDIS_AOF=no starts it without persistence, as the benchmark's comparison needs)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
port=${REDIS_PORT:-16379}
dir="$root/.cache/redis/$port"
pidfile="$dir/redis.pid"

ping() { redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; }

install() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null && return
  echo "redis.sh: installing redis-server with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
}

case "${1:-}" in
start)
  install
  if ping; then echo "redis.sh: already running on 127.0.0.1:$port"; exit 0; fi
  mkdir -p "$dir"
  redis-server --bind 127.0.0.1 --port "$port" --daemonize yes --dir "$dir" \
    --pidfile "$pidfile" --logfile "$dir/redis.log" --save "" \
    --appendonly "${REDIS_AOF:-yes}" --appendfsync everysec --protected-mode yes
  for _ in $(seq 1 50); do ping && { echo "redis.sh: up on 127.0.0.1:$port"; exit 0; }; sleep 0.1; done
  echo "redis.sh: redis did not answer on port $port; log follows" >&2
  tail -n 20 "$dir/redis.log" >&2 || true
  exit 1
  ;;
stop)
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || kill "$(cat "$pidfile")" || true
    for _ in $(seq 1 50); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.1; done
    echo "redis.sh: stopped"
  fi
  rm -rf "$dir"
  ;;
crash)
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    pid=$(cat "$pidfile")
    kill -9 "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "redis.sh: killed (data kept)"
  fi
  ;;
status)
  ping && echo "redis.sh: running on 127.0.0.1:$port" || { echo "redis.sh: not running"; exit 1; }
  ;;
*)
  echo "usage: $0 start|stop|crash|status" >&2; exit 2 ;;
esac
