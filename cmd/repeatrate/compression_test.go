package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

var codecs = []string{"none", "gzip", "snappy", "lz4", "zstd"}

// kafka-go counts a batch before compression and the broker checks it after: with every codec, a
// dead letter cut to the writer's limit and a batch filled to it, of bytes that do not compress
// (random bytes, base64 text), are accepted by the topic. Without the room compression's overhead
// takes, both were refused (Message Size Too Large) with every codec but none.
func TestCompressedBatchesFitTheTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, _ := isolated(ctx, t, "codec-fit", 1)
	rnd := rand.New(rand.NewSource(1))
	random := make([]byte, 1_048_500)
	rnd.Read(random)
	for _, codec := range codecs {
		kcfg := cfg.Kafka
		kcfg.Compression = codec
		kc, err := newKafkaClients(kcfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := kc.checkOutputLimits(ctx, []string{cfg.Kafka.DLQTopic, cfg.Kafka.InputTopics[0]}, zaptest.NewLogger(t)); err != nil {
			t.Fatal(err)
		}
		// A dead letter of a message at the input's limit, cut as the processor cuts them.
		w := kc.writer(cfg.Kafka.DLQTopic)
		dl := consumer.NewDeadLetters(w, nil).WithRecordLimit(int(w.BatchBytes))
		m := kafka.Message{Topic: cfg.Kafka.InputTopics[0], Offset: 7, Value: random}
		err = dl.Send(ctx, []consumer.DeadLetter{{Message: m, Reason: "invalid_json", Detail: "not json"}})
		w.Close()
		if err != nil {
			t.Errorf("%s: a dead letter cut to %d bytes was refused: %v", codec, w.BatchBytes, err)
		}
		// One batch of text records filling the writer's BatchBytes to the byte.
		w = kc.writer(cfg.Kafka.InputTopics[0])
		var msgs []kafka.Message
		total := 0
		text := func(n int) []byte {
			raw := make([]byte, n)
			rnd.Read(raw)
			return []byte(base64.StdEncoding.EncodeToString(raw))[:n]
		}
		for total+70_000 < int(w.BatchBytes) {
			m := kafka.Message{Key: []byte("k"), Value: text(64 << 10)}
			total += sink.RecordSize(&m)
			msgs = append(msgs, m)
		}
		last := kafka.Message{Key: []byte("k"), Value: text(int(w.BatchBytes) - total - 24)}
		msgs = append(msgs, last)
		total += sink.RecordSize(&last)
		err = w.WriteMessages(ctx, msgs...)
		w.Close()
		if total != int(w.BatchBytes) || err != nil {
			t.Errorf("%s: a batch of %d bytes of text (BatchBytes %d): %v", codec, total, w.BatchBytes, err)
		}
	}
}

// A processor whose writers compress dead-letters an input message of random bytes at the input
// topic's limit and goes on: its letter, cut to the dead-letter writer's limit, fits the topic
// once compressed. (Without the room, the publish was refused and retried: the partition stood still.)
func TestCompressingProcessorPassesAnIncompressibleDeadLetter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, kc := isolated(ctx, t, "codec-dlq", 1)
	random := make([]byte, 1_048_400)
	rand.New(rand.NewSource(2)).Read(random)
	w := kc.writer(cfg.Kafka.InputTopics[0]) // uncompressed: the input topic accepts it
	if err := w.WriteMessages(ctx, kafka.Message{Value: random},
		kafka.Message{Value: []byte(liveLine("after", "o1", "passed", "2025-01-01T00:00:00Z", "2025-01-01T00:00:00Z"))}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	cfg.Kafka.Compression = "snappy"
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runProcessor(pctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))) }()
	defer func() { stop(); <-done }()
	for {
		committed, err := kc.committed(ctx, cfg.Kafka.GroupID, cfg.Kafka.InputTopics, nil)
		if err != nil {
			t.Fatal(err)
		}
		if committed[cfg.Kafka.InputTopics[0]][0] >= 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the group never passed the incompressible message (committed %v)", committed)
		case <-time.After(200 * time.Millisecond):
		}
	}
	ends, err := kc.endOffsets(ctx, []string{cfg.Kafka.DLQTopic})
	if err != nil || ends[cfg.Kafka.DLQTopic][0] != 1 {
		t.Fatalf("dead-letter topic ends at %v (%v), want its one letter", ends, err)
	}
}

// The ingest on a compressing writer accepts a valid request whose records fill a whole batch of
// the uncompressed size with text that does not compress: 202, every event accepted. (Without the
// room, snappy's batch was refused and every attempt answered 503.)
func TestCompressingIngestAcceptsAFullBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const tok = "rr-test-acme-0123456789"
	base := startIngestRun(ctx, t, "codec-ingest", []auth.TokenConfig{
		{Name: "acme", SHA256: auth.Hash(tok), Workspaces: map[string]string{"acme": "read-write"}},
	}, func(cfg *Config) { cfg.Kafka.Compression = "snappy"; cfg.HTTP.RateLimit = 200 })
	dec, _ := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	batchBytes := int(sink.WriterBatchBytes(sink.DefaultTopicLimit))
	at := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	rnd := rand.New(rand.NewSource(5))
	event := func(i, predLen int) []byte {
		raw := make([]byte, predLen)
		rnd.Read(raw)
		pred := base64.StdEncoding.EncodeToString(raw)[:predLen]
		return []byte(fmt.Sprintf(`{"specversion":"1.0","id":"e-%d","source":"codec","type":"repeatrate.eval.result.v1","data":{"scope":{"workspace":"acme","model":"m","run":"r","checkpoint":"c","artifact":"a"},"suite":"s","case_id":"c1","version":"v1","version_seq":1,"run_index":%d,"runs":16,"result":"pass","prediction":%q,"occurred_at":%q,"assessed_at":%q}}`,
			i, i, pred, at, at))
	}
	size := func(b []byte) int {
		m := kafka.Message{Value: b, Headers: []kafka.Header{{Key: "content-type", Value: []byte(sink.ContentType)}}}
		ev, err := dec.DecodeStructured(b, time.Now())
		if err != nil {
			t.Fatalf("invalid event: %v", err)
		}
		m.Key = dec.MessageKey(ev, &m)
		return sink.RecordSize(&m)
	}
	var members [][]byte
	total := 0
	for i := range 15 {
		b := event(i, 64<<10)
		total += size(b)
		members = append(members, b)
	}
	framing := size(event(15, 1000)) - 1000
	members = append(members, event(15, batchBytes-40-total-framing))
	body := append([]byte("["), bytes.Join(members, []byte(","))...)
	body = append(body, ']')
	code, answer := postBatch(ctx, t, base, tok, body)
	if code != http.StatusAccepted || strings.Count(answer, `"status":"accepted"`) != 16 {
		t.Fatalf("a valid request of %d bytes answered %d: %.400s", len(body), code, answer)
	}
}

// Every subcommand that writes to Kafka takes --kafka-compression and refuses an unknown codec.
func TestEveryKafkaWriterTakesCompression(t *testing.T) {
	ctx := context.Background()
	for name, run := range map[string]func(codec string) error{
		"produce": func(codec string) error {
			return produceCommand(ctx, []string{"--brokers", "127.0.0.1:1", "--kafka-compression", codec, "--in", "/nonexistent"}, strings.NewReader(""), io.Discard)
		},
		"loadgen": func(codec string) error {
			return loadgenCommand(ctx, []string{"--brokers", "127.0.0.1:1", "--kafka-compression", codec, "--duration", "1ms"}, io.Discard)
		},
		"import": func(codec string) error {
			return importCommand(ctx, []string{"inspect", "--in", t.TempDir(), "--workspace", "w", "--to-kafka", "127.0.0.1:1", "--kafka-compression", codec}, io.Discard, io.Discard)
		},
	} {
		if err := run("zstd"); err != nil && strings.Contains(err.Error(), "not defined") {
			t.Errorf("%s: %v", name, err)
		}
		if err := run("brotli"); err == nil || !strings.Contains(err.Error(), "brotli") {
			t.Errorf("%s --kafka-compression brotli: %v, want the unknown codec named", name, err)
		}
	}
}
