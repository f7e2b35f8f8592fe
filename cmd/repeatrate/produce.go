package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/replay"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

func produceCommand(ctx context.Context, args []string, stdin io.Reader, stderr io.Writer) error {
	fs := newFlagSet("produce", stderr)
	brokers := fs.String("brokers", "127.0.0.1:9092", "Kafka bootstrap brokers (comma-separated)")
	topic := fs.String("topic", TopicLive, "topic to publish to")
	in := fs.String("in", "-", "NDJSON file of structured CloudEvents (- for standard input)")
	conn := kafkaConnectionFlags(fs, os.Getenv)
	if err := fs.Parse(args); err != nil {
		return err
	}
	kcfg, err := conn(strings.Split(*brokers, ","))
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	for _, w := range insecureWarnings(kcfg, nil) {
		fmt.Fprintln(stderr, "warning:", w)
	}
	r := stdin
	if *in != "-" {
		f, err := os.Open(*in)
		if err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		defer f.Close()
		r = f
	}
	kc, err := newKafkaClients(kcfg)
	if err != nil {
		return err
	}
	// A missing topic is created with 4 partitions, like the processor's own input topics.
	if err := kc.ensureTopics(ctx, []topicSpec{{name: *topic, partitions: 4}}); err != nil {
		return err
	}
	w := kc.writer(*topic)
	defer w.Close()
	prog := newProgress(stderr, "produce", inputSize(r))
	n, err := produce(ctx, prog.reader(r), w)
	prog.finish()
	fmt.Fprintf(stderr, "produced %d messages to %s\n", n, *topic)
	return err
}

// produce publishes every non-empty line as it is, in structured mode. A line that decodes is keyed
// as cloudevent.Decoder.MessageKey says (its aggregate, or the case of an eval result that is no
// correction check when that fits); other lines (poison) are published unkeyed.
func produce(ctx context.Context, r io.Reader, w consumer.MessageWriter) (int, error) {
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		return 0, err
	}
	lr := replay.NewLineReader(r, 64<<20)
	batch := make([]kafka.Message, 0, 1000)
	total := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := w.WriteMessages(ctx, batch...); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		total += len(batch)
		batch = batch[:0]
		return nil
	}
	now := time.Now()
	for {
		line, _, err := lr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return total, err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		m := kafka.Message{Value: slices.Clone(line), Headers: []kafka.Header{{Key: "content-type", Value: []byte(sink.ContentType)}}}
		if ev, err := dec.DecodeStructured(line, now); err == nil {
			m.Key = dec.MessageKey(ev, &m)
		}
		batch = append(batch, m)
		if len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return total, err
			}
		}
	}
	return total, flush()
}
