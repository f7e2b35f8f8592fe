#!/usr/bin/env bash
# Starts or stops the secured services of test/secure, on loopback and ports of their own:
#  - Redis (Debian's redis-server) with TLS only (no plain port) and ACL users: "admin" (everything,
#    for the test's set-up and checks) and "repeatrate", limited to the key prefix "rr" and the
#    commands the processor uses (the least-privilege line of docs/operations.md; REDIS_ACL below). The default
#    user is off.
#  - Apache Kafka (KRaft, one broker+controller, the jars of deploy/local/kafka.sh) whose only client
#    listener is SASL_SSL with SCRAM-SHA-512; users "admin" (the broker's own) and "repeatrate" are
#    created when the storage is formatted (kafka-storage format --add-scram).
# A self-signed CA and a server certificate for 127.0.0.1/localhost are made with openssl, and the
# passwords generated, once, under .cache/secure (git-ignored); .cache/secure/env holds what the
# test needs (sourced as shell or read as KEY=VALUE lines). Idempotent: "start" on running services
# is a no-op. "stop" stops what this script started and removes the data (keeps the certificates).
# Usage: deploy/local/secure.sh start|stop|status   (SECURE_REDIS_PORT, default 16443;
#        SECURE_KAFKA_PORT, default 19443, controller on +1)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rport=${SECURE_REDIS_PORT:-16443}
kport=${SECURE_KAFKA_PORT:-19443}
cport=$((kport + 1))
cache="$root/.cache/secure"
certs="$cache/certs"
rdir="$cache/redis-$rport"
kdir="$cache/kafka-$kport"
libs="$root/.cache/kafka/libs"

# The least-privilege ACL of the processor's Redis user (docs/operations.md, Security): keys and Pub/Sub
# channels under the prefix only; the commands of `run` (including alerting and the read side)
# and nothing else. EVALSHA runs the scripts, SCRIPT LOAD loads them after a NOSCRIPT, EVAL is what
# go-redis falls back to; the commands the scripts call are checked against the same list.
# CLUSTER SLOTS is the slot map on Redis Cluster. CONFIG GET (the eviction policy check) is left out
# on purpose: it would also read the server's secrets. test/secure keeps this list honest: it runs
# the processor as this user and requires Redis's ACL log to hold no other refusal.
REDIS_ACL='resetkeys ~rr:* resetchannels &rr:* -@all +ping +hello +auth +cluster|slots +evalsha +eval +script|load +time +get +set +del +exists +pexpire +pttl +persist +hget +hset +hsetnx +hdel +hmget +hgetall +hkeys +hvals +hlen +hincrby +hscan +lrange +llen +lindex +lpop +rpush +ltrim +sadd +srem +sismember +smembers +zadd +zrem +zcard +zscore +zrank +zrange +zrangebyscore +zremrangebyscore +zremrangebyrank +publish +subscribe +unsubscribe +wait'

rping() { redis-cli --tls --cacert "$certs/ca.pem" -h 127.0.0.1 -p "$rport" --user admin --pass "$ADMIN_PASSWORD" --no-auth-warning ping 2>/dev/null | grep -q PONG; }
klistening() { (exec 3<>"/dev/tcp/127.0.0.1/$kport") 2>/dev/null; }
krunning() { [ -f "$kdir/kafka.pid" ] && kill -0 "$(cat "$kdir/kafka.pid")" 2>/dev/null; }

# secrets makes the CA, the server certificate and the passwords once.
secrets() {
  mkdir -p "$certs"
  chmod 700 "$cache"
  if [ ! -f "$certs/server.pem" ]; then
    command -v openssl >/dev/null || { echo "secure.sh: openssl is required" >&2; exit 1; }
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=repeatrate test CA" \
      -keyout "$certs/ca.key" -out "$certs/ca.pem" 2>/dev/null
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$certs/server.key" 2>/dev/null
    openssl req -new -key "$certs/server.key" -subj "/CN=localhost" -out "$certs/server.csr" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >"$certs/ext.cnf"
    openssl x509 -req -in "$certs/server.csr" -CA "$certs/ca.pem" -CAkey "$certs/ca.key" -CAcreateserial \
      -days 3650 -extfile "$certs/ext.cnf" -out "$certs/server.pem" 2>/dev/null
    # Kafka's PEM key store: the PKCS#8 key, then the certificate chain.
    cat "$certs/server.key" "$certs/server.pem" >"$certs/kafka-keystore.pem"
    chmod 600 "$certs"/*.key "$certs/kafka-keystore.pem"
  fi
  if [ ! -f "$cache/passwords" ]; then
    gen() { openssl rand -hex 16; }
    umask 077
    cat >"$cache/passwords" <<EOF
ADMIN_PASSWORD=$(gen)
REDIS_PASSWORD=$(gen)
KAFKA_ADMIN_PASSWORD=$(gen)
KAFKA_PASSWORD=$(gen)
EOF
  fi
  # shellcheck disable=SC1091
  . "$cache/passwords"
  umask 077
  cat >"$cache/env" <<EOF
SECURE_CA_FILE=$certs/ca.pem
SECURE_REDIS_ADDR=127.0.0.1:$rport
SECURE_REDIS_ADMIN_PASSWORD=$ADMIN_PASSWORD
SECURE_REDIS_USERNAME=repeatrate
SECURE_REDIS_PASSWORD=$REDIS_PASSWORD
SECURE_REDIS_PREFIX=rr
SECURE_KAFKA_BROKERS=127.0.0.1:$kport
SECURE_KAFKA_USERNAME=repeatrate
SECURE_KAFKA_PASSWORD=$KAFKA_PASSWORD
EOF
}

start_redis() {
  command -v redis-server >/dev/null || { echo "secure.sh: redis-server is required (deploy/local/redis.sh installs it)" >&2; exit 1; }
  if rping; then echo "secure.sh: redis already running on 127.0.0.1:$rport (TLS)"; return; fi
  mkdir -p "$rdir"
  umask 077
  cat >"$rdir/users.acl" <<EOF
user default off
user admin on >$ADMIN_PASSWORD ~* &* +@all
user repeatrate on >$REDIS_PASSWORD $REDIS_ACL
EOF
  redis-server --bind 127.0.0.1 --port 0 --tls-port "$rport" --daemonize yes --dir "$rdir" \
    --pidfile "$rdir/redis.pid" --logfile "$rdir/redis.log" --save "" --appendonly no \
    --tls-cert-file "$certs/server.pem" --tls-key-file "$certs/server.key" \
    --tls-ca-cert-file "$certs/ca.pem" --tls-auth-clients no --aclfile "$rdir/users.acl" \
    --protected-mode yes
  for _ in $(seq 1 50); do rping && { echo "secure.sh: redis up on 127.0.0.1:$rport (TLS, ACL)"; return; }; sleep 0.1; done
  echo "secure.sh: redis did not answer on port $rport; log follows" >&2
  tail -n 20 "$rdir/redis.log" >&2 || true
  exit 1
}

start_kafka() {
  if krunning && klistening; then echo "secure.sh: kafka already running on 127.0.0.1:$kport (SASL_SSL)"; return; fi
  # The broker jars: deploy/local/kafka.sh resolves them (Maven) into the shared cache.
  if [ ! -f "$libs/.resolved" ]; then
    echo "secure.sh: the Kafka jars are missing; resolving them as deploy/local/kafka.sh does" >&2
    (cd "$here/kafka" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$libs")
    touch "$libs/.resolved"
  fi
  mkdir -p "$kdir/logs"
  umask 077
  cat >"$kdir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=SASL_SSL://127.0.0.1:$kport,CONTROLLER://127.0.0.1:$cport
advertised.listeners=SASL_SSL://127.0.0.1:$kport
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$KAFKA_ADMIN_PASSWORD";
ssl.keystore.type=PEM
ssl.keystore.location=$certs/kafka-keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$certs/ca.pem
ssl.client.auth=none
log.dirs=$kdir/data
num.partitions=4
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
  local java=(java -Xms128m -Xmx512m -XX:+UseG1GC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" -Dkafka.logs.dir="$kdir/logs" -cp "$libs/*")
  if [ ! -f "$kdir/data/meta.properties" ]; then
    "${java[@]}" kafka.tools.StorageTool format -t "$("${java[@]}" kafka.tools.StorageTool random-uuid)" \
      -c "$kdir/server.properties" \
      --add-scram "SCRAM-SHA-512=[name=admin,password=$KAFKA_ADMIN_PASSWORD]" \
      --add-scram "SCRAM-SHA-512=[name=repeatrate,password=$KAFKA_PASSWORD]" >"$kdir/logs/format.log" 2>&1 ||
      { cat "$kdir/logs/format.log" >&2; exit 1; }
  fi
  nohup "${java[@]}" kafka.Kafka "$kdir/server.properties" >"$kdir/logs/stdout.log" 2>&1 &
  echo $! >"$kdir/kafka.pid"
  for _ in $(seq 1 300); do
    if klistening && grep -q "Kafka Server started" "$kdir/logs/stdout.log" 2>/dev/null; then
      echo "secure.sh: kafka up on 127.0.0.1:$kport (SASL_SSL, SCRAM-SHA-512)"; return
    fi
    krunning || break
    sleep 0.2
  done
  echo "secure.sh: kafka did not start; log follows" >&2
  tail -n 40 "$kdir/logs/stdout.log" >&2 || true
  exit 1
}

stop_all() {
  if [ -f "$rdir/redis.pid" ] && kill -0 "$(cat "$rdir/redis.pid")" 2>/dev/null; then
    pid=$(cat "$rdir/redis.pid")
    kill "$pid" || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "secure.sh: redis stopped"
  fi
  rm -rf "$rdir"
  if krunning; then
    pid=$(cat "$kdir/kafka.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    echo "secure.sh: kafka stopped"
  fi
  rm -rf "$kdir"
}

case "${1:-}" in
start)
  secrets
  start_redis
  start_kafka
  ;;
stop)
  stop_all
  ;;
status)
  [ -f "$cache/passwords" ] && . "$cache/passwords" || ADMIN_PASSWORD=
  if rping && krunning && klistening; then
    echo "secure.sh: running (redis 127.0.0.1:$rport, kafka 127.0.0.1:$kport)"
  else
    echo "secure.sh: not running"; exit 1
  fi
  ;;
*)
  echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
