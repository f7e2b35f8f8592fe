#!/usr/bin/env bash
# Starts or stops a local three-broker Apache Kafka cluster (KRaft, each node broker+controller, so
# the controller quorum survives the loss of any one node) on loopback for tests, from the same
# Maven-resolved broker as deploy/local/kafka.sh. New topics default to replication factor 3 with
# min.insync.replicas=2, as do the group offsets topic and the transaction log. Small heaps
# (KAFKA_HEAP_OPTS, default -Xms128m -Xmx256m) keep three JVMs affordable on a laptop or CI box.
# Idempotent: "start" on a running cluster is a no-op; "start-node N" brings back node N after a
# test killed it, on its data. "stop" stops only the nodes this script started (by their pid files).
# Usage: deploy/local/kafka-cluster.sh start|stop|status|start-node N|pid N
#        (KAFKA_CLUSTER_PORT, default 19301: brokers on PORT..PORT+2, controllers on +10..+12)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
base=${KAFKA_CLUSTER_PORT:-19301}
heap=${KAFKA_HEAP_OPTS:--Xms128m -Xmx256m}
cache="$root/.cache/kafka"
libs="$cache/libs"
top="$cache/cluster-$base"

port() { echo $((base + $1 - 1)); }
cport() { echo $((base + 9 + $1)); }
dir() { echo "$top/node-$1"; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$(port "$1")") 2>/dev/null; }
running() { [ -f "$(dir "$1")/kafka.pid" ] && kill -0 "$(cat "$(dir "$1")/kafka.pid")" 2>/dev/null; }

# resolve fetches the broker as deploy/local/kafka.sh does, into the same directory.
resolve() {
  [ -f "$libs/.resolved" ] && return
  command -v java >/dev/null || { echo "kafka-cluster.sh: java 17 is required" >&2; exit 1; }
  command -v mvn >/dev/null || { echo "kafka-cluster.sh: maven is required" >&2; exit 1; }
  echo "kafka-cluster.sh: resolving the broker with maven into $libs" >&2
  rm -rf "$libs"
  (cd "$here/kafka" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$libs")
  touch "$libs/.resolved"
}

java_run() { java $heap -XX:+UseG1GC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
  -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" -Dkafka.logs.dir="$1/logs" \
  -cp "$libs/*" "${@:2}"; }

configure() {
  local n=$1 d
  d=$(dir "$n")
  mkdir -p "$d/logs"
  cat > "$d/server.properties" <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=1@127.0.0.1:$(cport 1),2@127.0.0.1:$(cport 2),3@127.0.0.1:$(cport 3)
listeners=PLAINTEXT://127.0.0.1:$(port "$n"),CONTROLLER://127.0.0.1:$(cport "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(port "$n")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$d/data
num.partitions=3
default.replication.factor=3
min.insync.replicas=2
auto.create.topics.enable=false
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
broker.session.timeout.ms=4000
broker.heartbeat.interval.ms=1000
replica.lag.time.max.ms=5000
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
background.threads=2
log.flush.interval.messages=9223372036854775807
# The log cleaner takes its dedupe buffer (128 MB by default) from the heap when the broker starts:
# with 256 MB and compacted topics to recover, a restarted broker ran out of memory.
log.cleaner.dedupe.buffer.size=16777216
PROPS
}

launch() {
  local n=$1 d
  d=$(dir "$n")
  nohup java $heap -XX:+UseG1GC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" -Dkafka.logs.dir="$d/logs" \
    -cp "$libs/*" kafka.Kafka "$d/server.properties" >"$d/logs/stdout.log" 2>&1 &
  echo $! > "$d/kafka.pid"
}

await() {
  local n=$1
  for _ in $(seq 1 450); do
    if listening "$n" && grep -q "Kafka Server started" "$(dir "$n")/logs/stdout.log" 2>/dev/null; then return 0; fi
    running "$n" || break
    sleep 0.2
  done
  echo "kafka-cluster.sh: node $n did not start; log follows" >&2
  tail -n 40 "$(dir "$n")/logs/stdout.log" >&2 || true
  return 1
}

halt() {
  local n=$1 pid
  running "$n" || return 0
  pid=$(cat "$(dir "$n")/kafka.pid")
  kill -CONT "$pid" 2>/dev/null || true
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
}

case "${1:-}" in
start)
  if running 1 && running 2 && running 3 && listening 1 && listening 2 && listening 3; then
    echo "kafka-cluster.sh: already running on 127.0.0.1:$base-$((base + 2))"; exit 0
  fi
  resolve
  for n in 1 2 3; do halt "$n"; done
  rm -rf "$top"
  id=""
  for n in 1 2 3; do
    configure "$n"
    [ -n "$id" ] || id=$(java_run "$(dir "$n")" kafka.tools.StorageTool random-uuid)
    java_run "$(dir "$n")" kafka.tools.StorageTool format -t "$id" -c "$(dir "$n")/server.properties" \
      >"$(dir "$n")/logs/format.log" 2>&1
  done
  for n in 1 2 3; do launch "$n"; done
  for n in 1 2 3; do await "$n"; done
  echo "kafka-cluster.sh: up on 127.0.0.1:$base-$((base + 2))"
  ;;
start-node)
  n=${2:?node 1..3}
  if running "$n" && listening "$n"; then exit 0; fi
  launch "$n"
  await "$n"
  echo "kafka-cluster.sh: node $n up on 127.0.0.1:$(port "$n")"
  ;;
stop)
  for n in 1 2 3; do halt "$n"; done
  rm -rf "$top"
  echo "kafka-cluster.sh: stopped"
  ;;
status)
  if running 1 && running 2 && running 3 && listening 1 && listening 2 && listening 3; then
    echo "kafka-cluster.sh: running on 127.0.0.1:$base-$((base + 2))"
  else
    echo "kafka-cluster.sh: not running"; exit 1
  fi
  ;;
pid)
  cat "$(dir "${2:?node 1..3}")/kafka.pid"
  ;;
*)
  echo "usage: $0 start|stop|status|start-node N|pid N" >&2; exit 2 ;;
esac
