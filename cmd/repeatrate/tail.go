package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"
)

func tailCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	brokers := fs.String("brokers", "127.0.0.1:9092", "Kafka bootstrap brokers (comma-separated)")
	topic := fs.String("topic", TopicSnapshots, "topic to print")
	idle := fs.Duration("idle", 5*time.Second, "exit after this long without a new message")
	if err := fs.Parse(args); err != nil {
		return err
	}
	kc, err := newKafkaClients(KafkaConfig{Brokers: strings.Split(*brokers, ",")})
	if err != nil {
		return err
	}
	return tail(ctx, kc, *topic, *idle, func(m kafka.Message) error {
		_, err := fmt.Fprintf(stdout, "%s\n", m.Value)
		return err
	})
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
