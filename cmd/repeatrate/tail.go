package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"
)

func tailCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tail", stderr)
	brokers := fs.String("brokers", "127.0.0.1:9092", "Kafka bootstrap brokers (comma-separated)")
	topic := fs.String("topic", TopicSnapshots, "topic to print")
	idle := fs.Duration("idle", 5*time.Second, "exit after this long without a new message")
	headers := fs.Bool("headers", false, "print each message as {topic, partition, offset, key, headers, value} "+
		"(the default on the dead-letter topic, whose headers say why each message is there)")
	conn := kafkaConnectionFlags(fs, os.Getenv)
	if err := fs.Parse(args); err != nil {
		return err
	}
	kcfg, err := conn(strings.Split(*brokers, ","))
	if err != nil {
		return fmt.Errorf("tail: %w", err)
	}
	for _, w := range insecureWarnings(kcfg, nil) {
		fmt.Fprintln(stderr, "warning:", w)
	}
	withHeaders := *headers
	if !flagSet(fs, "headers") && *topic == TopicDLQ {
		withHeaders = true
	}
	kc, err := newKafkaClients(kcfg)
	if err != nil {
		return err
	}
	return tail(ctx, kc, *topic, *idle, func(m kafka.Message) error {
		if !withHeaders {
			_, err := fmt.Fprintf(stdout, "%s\n", m.Value)
			return err
		}
		b, err := json.Marshal(tailedOf(m))
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	})
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// tailed is a message as `tail --headers` prints it: headers as text, in order, and the value as
// JSON when it is JSON, else as text.
type tailed struct {
	Topic     string          `json:"topic"`
	Partition int             `json:"partition"`
	Offset    int64           `json:"offset"`
	Key       string          `json:"key,omitempty"`
	Headers   []tailedHeader  `json:"headers"`
	Value     json.RawMessage `json:"value"`
}

type tailedHeader struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

func tailedOf(m kafka.Message) tailed {
	t := tailed{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: string(m.Key), Headers: []tailedHeader{}}
	for _, h := range m.Headers {
		t.Headers = append(t.Headers, tailedHeader{Key: h.Key, Value: strings.ToValidUTF8(string(h.Value), "\uFFFD")})
	}
	if json.Valid(m.Value) {
		t.Value = m.Value
	} else {
		t.Value, _ = json.Marshal(strings.ToValidUTF8(string(m.Value), "\uFFFD"))
	}
	return t
}

// tail reads every partition of topic from the beginning and calls fn for each message, in arrival
// order, until no message has arrived for idle.
func tail(ctx context.Context, kc *kafkaClients, topic string, idle time.Duration, fn func(kafka.Message) error) error {
	parts, err := kc.partitions(ctx, topic)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs := make(chan kafka.Message, 256)
	g, gctx := errgroup.WithContext(ctx)
	for _, p := range parts {
		g.Go(func() error {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: kc.brokers, Dialer: kc.dialer, Topic: topic, Partition: p,
				MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 200 * time.Millisecond})
			defer r.Close()
			if err := r.SetOffset(kafka.FirstOffset); err != nil {
				return err
			}
			for {
				m, err := r.FetchMessage(gctx)
				if err != nil {
					if gctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("tail %s/%d: %w", topic, p, err)
				}
				select {
				case msgs <- m:
				case <-gctx.Done():
					return nil
				}
			}
		})
	}
	timer := time.NewTimer(idle)
	defer timer.Stop()
	var ferr error
loop:
	for {
		select {
		case m := <-msgs:
			if ferr = fn(m); ferr != nil {
				break loop
			}
			timer.Reset(idle)
		case <-timer.C:
			break loop
		case <-gctx.Done():
			break loop
		}
	}
	cancel()
	if err := g.Wait(); err != nil {
		return err
	}
	return ferr
}
