package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
)

func TestConfigPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(file, []byte("kafka:\n  group_id: from-file\n  brokers: [f1:9092]\nretention: 1000h\nredis:\n  addrs: [r1:6379]\n"), 0o600)
	env := map[string]string{
		"REPEATRATE_CONFIG":         file,
		"REPEATRATE_KAFKA_GROUP_ID": "from-env",
		"REPEATRATE_REDIS_PASSWORD": "s3cret",
		"REPEATRATE_RETENTION":      "40d",
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg, err := loadConfig(fs, []string{"--kafka-group-id", "from-flag", "--kafka-create-topics"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"flag beats env and file", cfg.Kafka.GroupID, "from-flag"},
		{"file beats default", cfg.Kafka.Brokers[0], "f1:9092"},
		{"env beats file", cfg.Retention, 40 * 24 * time.Hour},
		{"env sets secrets", cfg.Redis.Password, "s3cret"},
		{"bool flag", cfg.Kafka.CreateTopics, true},
		{"default kept", cfg.Kafka.SnapshotTopic, TopicSnapshots},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--nope"}, "flag provided but not defined"},
		{"bad duration", []string{"--retention", "soon"}, "--retention"},
		{"output as input", []string{"--kafka-input-topics", "repeatrate.snapshots"}, "also an output topic"},
		{"bad sasl", []string{"--kafka-sasl-mechanism", "kerberos"}, "kafka.sasl.mechanism"},
		{"unknown compression codec", []string{"--kafka-compression", "brotli"}, "kafka.compression"},
		{"sasl without user", []string{"--kafka-sasl-mechanism", "scram-sha-512"}, "kafka.sasl.username"},
		{"short retention", []string{"--retention", "10m"}, "retention"},
		{"bad level", []string{"--log-level", "loud"}, "log_level"},
		// A skew beyond what the minute buckets keep would undercount the 1h window.
		{"skew above the minute buckets", []string{"--max-future-skew", "11m"}, "max_future_skew"},
		// pass@k levels are bounded so that a stability snapshot fits its record limit.
		{"too many pass@k levels", []string{"--suite-pass-at-k", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"}, "pass_at_k"},
		{"pass@k above MaxRuns", []string{"--suite-pass-at-k", "10001"}, "pass_at_k"},
		{"negative wait replicas", []string{"--redis-wait-replicas", "-1"}, "redis.wait_replicas"},
		// WAIT with a timeout of 0 ms blocks forever.
		{"wait timeout below 1ms", []string{"--redis-wait-timeout", "500us"}, "redis.wait_timeout"},
		{"state layout neither 10 nor 11", []string{"--redis-state-layout", "9"}, "redis.state_layout"},
		{"bucket cache under 1 MiB", []string{"--redis-bucket-cache-bytes", "1048575"}, "redis.bucket_cache_bytes"},
		// The profiler is never open to whoever reaches the port.
		{"pprof without an admin token", []string{"--pprof"}, "pprof: /debug/pprof needs http.admin_token_sha256"},
		// The ingest's in-flight budget holds at least two of its largest requests.
		{"ingest budget below two bodies", []string{"--http-ingest-max-inflight-bytes", "1000"}, "http.ingest_max_inflight_bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("run", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			_, err := loadConfig(fs, tc.args, func(string) string { return "" })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
	// An unknown key in the file is an error, not silently ignored.
	file := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(file, []byte("kafka:\n  brokerz: [x]\n"), 0o600)
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	if _, err := loadConfig(fs, []string{"--config", file}, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "brokerz") {
		t.Fatalf("err = %v, want unknown field brokerz", err)
	}
}

// TestBucketCacheBoundReachesTheStore: redis.bucket_cache_bytes, at its least (1 MiB) or its
// default, is the bound the rates store is opened with.
func TestBucketCacheBoundReachesTheStore(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int64
	}{{nil, aggregator.DefaultBucketCacheBytes}, {[]string{"--redis-bucket-cache-bytes", "1048576"}, 1 << 20}} {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg, err := loadConfig(fs, tc.args, func(string) string { return "" })
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := storeConfig(aggregator.State{Namespace: "rr"}, cfg).BucketCacheBytes; got != tc.want {
			t.Fatalf("%v: the store's bound is %d, want %d", tc.args, got, tc.want)
		}
	}
}
