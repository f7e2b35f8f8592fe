# The two commands of the README: `make dev` (the processor with demo traffic on embedded Kafka and
# Redis) and `make test` (every test, on real Redis and Kafka that it starts and stops itself).
.PHONY: dev test unit bench build services-up services-down fuzz

# Built, then run as itself (not under `go run`, which exits 1 on Ctrl-C): Ctrl-C ends it with 0.
# `make dev ARGS="--http-addr 127.0.0.1:9090 --rate 100"` passes flags to dev.
dev: build
	bin/repeatrate dev --demo $(ARGS)

test:
	deploy/local/test.sh

# Throughput, latency and memory on real services; see BENCHMARKS.md.
bench:
	deploy/local/bench.sh

# Pure-logic tests only: no services needed (integration tests skip).
unit:
	go test -count=1 ./...

build:
	go build -ldflags "-X main.commit=$$(git rev-parse --short=12 HEAD 2>/dev/null)" -o bin/repeatrate ./cmd/repeatrate

services-up:
	deploy/local/redis.sh start
	deploy/local/kafka.sh start

services-down:
	deploy/local/kafka.sh stop
	deploy/local/redis.sh stop

fuzz:
	go test -run '^$$' -fuzz FuzzDecode -fuzztime 60s ./schemas/cloudevent
