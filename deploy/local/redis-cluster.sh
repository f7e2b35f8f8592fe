#!/usr/bin/env bash
# Starts or stops a local Redis Cluster for tests: six Debian redis-server processes in cluster
# mode on loopback (three primaries, one replica each, made with `redis-cli --cluster create`),
# AOF on (appendfsync everysec), data under .cache/redis-cluster. Failover is quick
# (cluster-node-timeout 2 s) and any replica may be promoted however far it lags
# (cluster-replica-validity-factor 0), which is what lets the tests provoke a failover that loses
# acknowledged writes. Idempotent: "start" on a healthy cluster is a no-op. "stop" stops only the
# nodes this script started (by their pid files) and removes their data.
# Usage: deploy/local/redis-cluster.sh start|stop|status|pid PORT|start-node PORT
#        (REDIS_CLUSTER_PORT, default 17001: nodes on PORT..PORT+5, cluster bus on +10000)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
base=${REDIS_CLUSTER_PORT:-17001}
ports=$(seq "$base" $((base + 5)))
cache="$root/.cache/redis-cluster"

# healthy: every slot served, three primaries with slots and three replicas in sync with them.
healthy() {
  # Every node, not only the first, must see every slot served: a node whose view still says
  # otherwise (it has not heard of a failover yet) answers CLUSTERDOWN to whatever reaches it.
  for p in $ports; do
    redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || return 1
  done
  local nodes
  nodes=$(redis-cli -h 127.0.0.1 -p "$base" cluster nodes 2>/dev/null) || return 1
  [ "$(grep -v fail <<<"$nodes" | grep -c master)" -eq 3 ] && [ "$(grep -v fail <<<"$nodes" | grep -c slave)" -eq 3 ] || return 1
  for p in $ports; do
    local info
    info=$(redis-cli -h 127.0.0.1 -p "$p" info replication 2>/dev/null) || return 1
    if grep -q role:slave <<<"$info"; then grep -q master_link_status:up <<<"$info" || return 1; fi
  done
}
ping() { redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; }

install() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null && return
  echo "redis-cluster.sh: installing redis-server with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
}

launch() {
  local p=$1
  mkdir -p "$cache/$p"
  redis-server --bind 127.0.0.1 --port "$p" --daemonize yes --dir "$cache/$p" \
    --pidfile "$cache/$p/redis.pid" --logfile "$cache/$p/redis.log" --save "" \
    --appendonly yes --appendfsync everysec --protected-mode yes \
    --cluster-enabled yes --cluster-config-file "$cache/$p/nodes.conf" \
    --cluster-node-timeout 2000 --cluster-replica-validity-factor 0 \
    --cluster-require-full-coverage no --cluster-allow-reads-when-down no
}

halt() {
  for p in $ports; do
    local pidfile="$cache/$p/redis.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      local pid
      pid=$(cat "$pidfile")
      kill -CONT "$pid" 2>/dev/null || true # a test may have paused it
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
}

case "${1:-}" in
start)
  install
  if healthy; then echo "redis-cluster.sh: already running on 127.0.0.1:$base-$((base + 5))"; exit 0; fi
  halt # a half-made cluster from an interrupted run: start over
  rm -rf "$cache"
  for p in $ports; do launch "$p"; done
  for p in $ports; do
    for _ in $(seq 1 50); do ping "$p" && break; sleep 0.1; done
    ping "$p" || { echo "redis-cluster.sh: node $p did not answer" >&2; tail -n 20 "$cache/$p/redis.log" >&2; exit 1; }
  done
  addrs=()
  for p in $ports; do addrs+=("127.0.0.1:$p"); done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$cache/create.log" 2>&1 ||
    { echo "redis-cluster.sh: cluster create failed" >&2; cat "$cache/create.log" >&2; exit 1; }
  for _ in $(seq 1 200); do
    if healthy; then echo "redis-cluster.sh: up on 127.0.0.1:$base-$((base + 5))"; exit 0; fi
    sleep 0.1
  done
  echo "redis-cluster.sh: cluster did not become ok" >&2
  redis-cli -h 127.0.0.1 -p "$base" cluster nodes >&2 || true
  exit 1
  ;;
stop)
  halt
  rm -rf "$cache"
  echo "redis-cluster.sh: stopped"
  ;;
status)
  healthy && echo "redis-cluster.sh: running on 127.0.0.1:$base-$((base + 5))" || { echo "redis-cluster.sh: not running"; exit 1; }
  ;;
pid)
  cat "$cache/${2:?port}/redis.pid"
  ;;
start-node)
  # Brings back a node a test killed, on its data: it rejoins the cluster (a replica, when its
  # replica was promoted meanwhile). Then waits until the cluster is healthy again.
  p=${2:?port}
  ping "$p" || launch "$p"
  for _ in $(seq 1 300); do healthy && { echo "redis-cluster.sh: node $p back, cluster healthy"; exit 0; }; sleep 0.1; done
  echo "redis-cluster.sh: cluster not healthy after restarting $p" >&2; exit 1
  ;;
*)
  echo "usage: $0 start|stop|status|pid PORT|start-node PORT" >&2; exit 2 ;;
esac
