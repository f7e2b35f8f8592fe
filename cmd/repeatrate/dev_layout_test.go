package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
)

// dev refuses a state layout no build writes, by its flag's name, before it prints or starts
// anything.
func TestDevRefusesAnUnknownStateLayout(t *testing.T) {
	for _, v := range []string{"9", "12", "0"} {
		var out strings.Builder
		err := devCommand(t.Context(), []string{"--redis-state-layout", v, "--kafka-addr", "127.0.0.1:0", "--redis-addr", "127.0.0.1:0",
			"--http-addr", "127.0.0.1:0"}, &out, &out)
		if err == nil || !strings.Contains(err.Error(), "--redis-state-layout") || out.Len() != 0 {
			t.Errorf("--redis-state-layout %s: %v, printed %q", v, err, out.String())
		}
	}
}

// dev --redis-state-layout 11 keeps the demo's state in layout 11 on the embedded Redis (gopher-lua):
// its namespace's epoch names layout 11 and its aggregates keep packed record stores, and it stops
// cleanly.
func TestDevRunsLayout11(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var out strings.Builder
	go func() {
		done <- devCommand(dctx, []string{"--demo", "--rate", "200", "--redis-state-layout", "11", "--kafka-addr", "127.0.0.1:0",
			"--redis-addr", addr, "--http-addr", "127.0.0.1:0"}, &out, &out)
	}()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	for {
		epoch, _ := rdb.Get(ctx, aggregator.EpochKey("rr")).Result()
		stores, _, _ := rdb.Scan(ctx, 0, "rr:{*}:e", 1000).Result()
		records, _, _ := rdb.Scan(ctx, 0, "rr:{*}:o", 1000).Result()
		if strings.HasSuffix(epoch, "/layout11") && len(stores) > 0 {
			if len(records) > 0 {
				t.Fatalf("layout 11 wrote record hashes: %v", records)
			}
			break
		}
		select {
		case err := <-done:
			t.Fatalf("dev stopped: %v", err)
		case <-ctx.Done():
			t.Fatalf("no layout-11 state on the embedded Redis: epoch %q, %d stores", epoch, len(stores))
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("dev: %v", err)
	}
}
