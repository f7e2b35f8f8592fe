package main

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// produce, loadgen, import and tail take the same Kafka connection options as run (TLS, SASL, the
// writers' compression): flags over REPEATRATE_*.
func TestKafkaConnectionFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want KafkaConfig
	}{
		{"none", nil, nil, KafkaConfig{Brokers: []string{"b:9093"}}},
		{"flags", []string{"--kafka-tls", "--kafka-tls-ca-file=ca.pem", "--kafka-tls-server-name=kafka.internal",
			"--kafka-sasl-mechanism=scram-sha-512", "--kafka-sasl-username=rr"}, map[string]string{"REPEATRATE_KAFKA_SASL_PASSWORD": "pw"},
			KafkaConfig{Brokers: []string{"b:9093"}, TLS: TLSConfig{Enabled: true, CAFile: "ca.pem", ServerName: "kafka.internal"},
				SASL: SASLConfig{Mechanism: "scram-sha-512", Username: "rr", Password: "pw"}}},
		{"compression", []string{"--kafka-compression=zstd"}, nil, KafkaConfig{Brokers: []string{"b:9093"}, Compression: "zstd"}},
		{"compression from env", nil, map[string]string{"REPEATRATE_KAFKA_COMPRESSION": "lz4"}, KafkaConfig{Brokers: []string{"b:9093"}, Compression: "lz4"}},
		{"flag over env", []string{"--kafka-sasl-username=flag"}, map[string]string{"REPEATRATE_KAFKA_SASL_USERNAME": "env", "REPEATRATE_KAFKA_TLS_INSECURE_SKIP_VERIFY": "true", "REPEATRATE_KAFKA_TLS": "1"},
			KafkaConfig{Brokers: []string{"b:9093"}, TLS: TLSConfig{Enabled: true, InsecureSkipVerify: true}, SASL: SASLConfig{Username: "flag"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("produce", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			conn := kafkaConnectionFlags(fs, func(k string) string { return tc.env[k] })
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := conn([]string{"b:9093"})
			if err != nil {
				t.Fatal(err)
			}
			if g, w := strings.Join(got.Brokers, ","), strings.Join(tc.want.Brokers, ","); g != w || got.TLS != tc.want.TLS || got.SASL != tc.want.SASL ||
				got.Compression != tc.want.Compression {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Turning certificate checks off is never silent.
func TestInsecureSkipVerifyWarns(t *testing.T) {
	on := TLSConfig{Enabled: true, InsecureSkipVerify: true}
	if w := insecureWarnings(KafkaConfig{TLS: on}, &RedisConfig{TLS: on}); len(w) != 2 {
		t.Fatalf("warnings %q, want one per connection", w)
	}
	if w := insecureWarnings(KafkaConfig{TLS: TLSConfig{Enabled: true}}, &RedisConfig{}); len(w) != 0 {
		t.Fatalf("warnings %q with verification on", w)
	}
	var stderr bytes.Buffer
	err := produceCommand(t.Context(), []string{"--brokers=127.0.0.1:1", "--kafka-tls", "--kafka-tls-insecure-skip-verify", "--in=/nonexistent"}, nil, &stderr)
	if err == nil || !strings.Contains(stderr.String(), "warning: kafka TLS certificate verification is off") {
		t.Fatalf("produce with insecure TLS: err %v, stderr %q", err, stderr.String())
	}
}

// go-redis's own messages go to the JSON log.
func TestRedisLogsThroughZap(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	redisLog{zap.New(core)}.Printf(t.Context(), "redis: connection pool: failed to dial after %d attempts\n", 5)
	if e := logs.All(); len(e) != 1 || e[0].Message != "redis: connection pool: failed to dial after 5 attempts" {
		t.Fatalf("logged %+v", e)
	}
}
