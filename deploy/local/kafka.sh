#!/usr/bin/env bash
# Starts or stops a local single-node Apache Kafka (KRaft, broker+controller) on loopback for tests.
# The broker jars are resolved by Maven from deploy/local/kafka/pom.xml into .cache/kafka/libs
# (git-ignored); Java 17 runs kafka.Kafka from there. Idempotent: "start" on a running broker is a no-op.
# "restart" stops the broker cleanly and starts it again on the same data.
# Usage: deploy/local/kafka.sh start|stop|restart|status   (KAFKA_PORT, default 19092; controller on +1)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
port=${KAFKA_PORT:-19092}
cport=$((port + 1))
cache="$root/.cache/kafka"
libs="$cache/libs"
dir="$cache/node-$port"
pidfile="$dir/kafka.pid"

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

resolve() {
  [ -f "$libs/.resolved" ] && return
  command -v java >/dev/null || { echo "kafka.sh: java 17 is required" >&2; exit 1; }
  command -v mvn >/dev/null || { echo "kafka.sh: maven is required" >&2; exit 1; }
  echo "kafka.sh: resolving the broker with maven into $libs" >&2
  rm -rf "$libs"
  (cd "$here/kafka" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$libs")
  touch "$libs/.resolved"
}

java_run() { java -Xms256m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true \
  -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" -Dkafka.logs.dir="$dir/logs" \
  -cp "$libs/*" "$@"; }

halt() {
  if running; then
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    echo "kafka.sh: stopped"
  fi
}

case "${1:-}" in
restart)
  halt
  "$0" start
  ;;
start)
  if running && listening; then echo "kafka.sh: already running on 127.0.0.1:$port"; exit 0; fi
  resolve
  mkdir -p "$dir/logs"
  cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=4
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.flush.interval.messages=9223372036854775807
PROPS
  if [ ! -f "$dir/data/meta.properties" ]; then
    id=$(java_run kafka.tools.StorageTool random-uuid)
    java_run kafka.tools.StorageTool format -t "$id" -c "$dir/server.properties" >"$dir/logs/format.log" 2>&1
  fi
  nohup java -Xms256m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" -Dkafka.logs.dir="$dir/logs" \
    -cp "$libs/*" kafka.Kafka "$dir/server.properties" >"$dir/logs/stdout.log" 2>&1 &
  echo $! > "$pidfile"
  for _ in $(seq 1 300); do
    if listening && grep -q "Kafka Server started" "$dir/logs/stdout.log" 2>/dev/null; then
      echo "kafka.sh: up on 127.0.0.1:$port"; exit 0
    fi
    running || break
    sleep 0.2
  done
  echo "kafka.sh: broker did not start; log follows" >&2
  tail -n 40 "$dir/logs/stdout.log" >&2 || true
  exit 1
  ;;
stop)
  halt
  rm -rf "$dir"
  ;;
status)
  running && listening && echo "kafka.sh: running on 127.0.0.1:$port" || { echo "kafka.sh: not running"; exit 1; }
  ;;
*)
  echo "usage: $0 start|stop|restart|status" >&2; exit 2 ;;
esac
