package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/internal/synth"
)

// The data shapes the harness can run (BENCH_SHAPES, all by default).
const (
	shapeToday = "today" // 400 aggregates, the stream the earlier records measured
	shapeWide  = "wide"  // 60 live aggregates, occurred times over 30 days
	shapeEval  = "eval"  // one suite version growing to BENCH_SUITE_RUNS runs
)

var allShapes = []string{shapeToday, shapeWide, shapeEval}

// wideSpread is the wide shape's spread of occurred times: 30 days less the hour of slack that
// keeps the oldest opportunities inside the processor's default 30-day retention for the run.
const wideSpread = 30*24*time.Hour - time.Hour

// input is a generated stream in a file and in a topic of 4 partitions.
type input struct {
	shape string
	file  string
	topic string
	n     int // messages
	runs  int // graded runs among them (eval results)
	// warm is how many of the messages the processor runs before the measured interval begins
	// (0: it begins at the first processed batch), so that it measures a processor that has been
	// running, not one that starts (BENCH_PREFILL_WARM).
	warm int
}

// todayInput is today's shape: 10 workspaces × 2 models × 10 corrections × 2 sources = 400
// aggregates, 30 % eval results (one run each), 10 % re-assessments, dup of duplicates, new
// opportunities occurred within 30 s of generation.
func (e *env) todayInput(name string, dup float64) (*input, error) {
	return e.todayInputOf(name, todayConfig(dup, 0, 0), e.n)
}

// todayInputOf is a today-shaped input of n events of the generator cfg (todayConfig, or a
// prefill round's: roundConfig).
func (e *env) todayInputOf(name string, cfg synth.Config, n int) (*input, error) {
	gen := synth.New(cfg)
	now, i := time.Now(), 0
	return e.input(shapeToday, name, func() ([]byte, bool) {
		if i == n {
			return nil, false
		}
		i++
		l, _ := gen.Line(now)
		return l, true
	})
}

// todayConfig is the today shape's generator, dup of its events duplicates, its ids numbered
// from skip (inputs whose numbers never meet name different opportunities, so each is new to a
// store that holds the others), its workspaces from firstWorkspace (inputs apart by 10 or more
// count in different aggregates).
func todayConfig(dup float64, skip, firstWorkspace int) synth.Config {
	return synth.Config{Seed: 11, Workspaces: 10, Corrections: 10, Duplicates: dup, Reassessed: 0.1, EvalShare: 0.3, Skip: skip,
		FirstWorkspace: firstWorkspace}
}

// wideInput is the wide shape: live attempts only, 3 workspaces × 2 models × 10 corrections = 60
// aggregates, occurred times spread uniformly over 30 days (so each aggregate keeps about 720
// hour lists), 20 % duplicates, 10 % re-assessments.
func (e *env) wideInput() (*input, error) {
	gen := synth.New(synth.Config{Seed: 23, Workspaces: 3, Corrections: 10, Duplicates: 0.2, Reassessed: 0.1, Spread: wideSpread})
	now, i := time.Now(), 0
	return e.input(shapeWide, "wide", func() ([]byte, bool) {
		if i == e.n {
			return nil, false
		}
		i++
		l, _ := gen.Line(now)
		return l, true
	})
}

// evalInput is the eval shape: e.suiteRuns graded runs of one suite version (5 runs per case,
// case by case, predictions of 3–40 words), the runs of half the cases correction checks (each
// case of one of 10 corrections), and 10 % live attempts mixed in; no duplicates, so every eval
// result adds a run. Produced as `produce` keys it: a case's runs share a partition.
func (e *env) evalInput() (*input, error) {
	gen := synth.NewEval(synth.EvalConfig{Seed: 37, Runs: e.suiteRuns, RunsPerCase: 5, LiveShare: 0.1, Checks: 0.5})
	now := time.Now()
	in, err := e.input(shapeEval, "eval", func() ([]byte, bool) { return gen.Next(now) })
	if in != nil {
		in.runs = gen.Runs()
	}
	return in, err
}

// input writes the generated lines to a file and produces them to a new topic with the current
// binary's produce command.
func (e *env) input(shape, name string, next func() ([]byte, bool)) (*input, error) {
	in := &input{shape: shape, file: filepath.Join(e.dir, name+".ndjson"), topic: e.run + "." + name}
	f, err := os.Create(in.file)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriter(f)
	for {
		line, ok := next()
		if !ok {
			break
		}
		w.Write(line)
		w.WriteByte('\n')
		in.n++
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	client := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: time.Minute}
	if _, err := client.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: in.topic, NumPartitions: 4, ReplicationFactor: 1}}}); err != nil {
		return nil, err
	}
	start := time.Now()
	cmd := exec.Command(e.bins[0].path, "produce", "--brokers", strings.Join(e.brokers, ","), "--topic", in.topic, "--in", in.file)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("produce: %v: %s", err, out)
	}
	logf("produced %s: %d events in %s", in.topic, in.n, time.Since(start).Round(time.Millisecond))
	return in, nil
}

// deleteTopics deletes every topic this run created (its inputs and the processors' outputs, all
// named after e.run), so repeated runs do not fill the broker's disk.
func (e *env) deleteTopics(ctx context.Context) {
	conn, err := kafka.DialContext(ctx, "tcp", e.brokers[0])
	if err != nil {
		return
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions()
	if err != nil {
		return
	}
	seen := map[string]bool{}
	var topics []string
	for _, p := range parts {
		if (strings.HasPrefix(p.Topic, e.run+".") || strings.HasPrefix(p.Topic, e.run+"-")) && !seen[p.Topic] {
			seen[p.Topic] = true
			topics = append(topics, p.Topic)
		}
	}
	if len(topics) == 0 {
		return
	}
	client := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: time.Minute}
	if _, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics}); err != nil {
		logf("delete topics: %v", err)
	}
}
