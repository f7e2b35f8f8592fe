package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/repeatrate/repeatrate/replay"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

func replayCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("replay", stderr)
	in := fs.String("in", "", "NDJSON file of structured CloudEvents (- for standard input)")
	asOf := fs.String("as-of", "", "observation time, RFC 3339 (default: the largest occurred_at seen)")
	out := fs.String("out", "", "write snapshots here instead of standard output")
	dlq := fs.String("dlq", "", "write dead letters here instead of standard error")
	retention := fs.String("retention", "30d", "opportunity identity retention, as for run")
	maxMsg := fs.Int("max-message-bytes", cloudevent.DefaultDecoderConfig.MaxMessageBytes, "largest accepted event")
	sc := defaultConfig().Suite
	fs.IntVar(&sc.MinHistory, "min-history", sc.MinHistory, "versions with an outcome before a case is judged")
	fs.IntVar(&sc.JudgeLastVersions, "judge-last-versions", 0, "judge cases over only the last R versions (0: all)")
	passAtK := fs.String("pass-at-k", strings.Join(sc.PassAtK, ","), "pass@k levels")
	fs.StringVar(&sc.ReplyMode, "reply-mode", sc.ReplyMode, "reply repetition rules: default or opencompass")
	fs.StringVar(&sc.Tokenizer, "tokenizer", sc.Tokenizer, "what reply analysis counts as a token: whitespace, o200k_base or cl100k_base")
	fs.DurationVar(&sc.MissingAfter, "missing-after", sc.MissingAfter, "planned runs count as missing this long after a case's first run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" {
		return errors.New("replay: --in is required")
	}
	sc.PassAtK = strings.Split(*passAtK, ",")
	suiteCfg, err := sc.aggregator()
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	ret, err := parseDuration(*retention)
	if err != nil || ret <= 0 {
		return fmt.Errorf("replay: --retention %q: must be a positive duration", *retention)
	}
	var at time.Time
	if *asOf != "" {
		if at, err = time.Parse(time.RFC3339Nano, *asOf); err != nil {
			return fmt.Errorf("replay: --as-of: %w", err)
		}
	}
	r := stdin
	if *in != "-" {
		f, err := os.Open(*in)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		defer f.Close()
		r = f
	}
	snapOut, closeOut, err := createOr(*out, stdout)
	if err != nil {
		return err
	}
	defer closeOut()
	dlqOut, closeDLQ, err := createOr(*dlq, stderr)
	if err != nil {
		return err
	}
	defer closeDLQ()

	dcfg := cloudevent.DefaultDecoderConfig
	dcfg.MaxMessageBytes = *maxMsg
	dec, err := cloudevent.NewDecoder(dcfg)
	if err != nil {
		return err
	}
	// Progress on a terminal; done before anything else is written there.
	prog := newProgress(stderr, "replay", inputSize(r))
	res, err := replay.Run(ctx, prog.reader(r), dec, ret, suiteCfg, at, time.Now())
	prog.finish()
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(snapOut)
	for i := range res.Outs {
		b, err := sink.Encode(&res.Outs[i])
		if err != nil {
			return err
		}
		bw.Write(b)
		bw.WriteByte('\n')
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("replay: write snapshots: %w", err)
	}
	enc := json.NewEncoder(dlqOut)
	for _, d := range res.DeadLetters {
		if err := enc.Encode(d); err != nil {
			return fmt.Errorf("replay: write dead letters: %w", err)
		}
	}
	return nil
}

func createOr(path string, def io.Writer) (io.Writer, func(), error) {
	if path == "" || path == "-" {
		return def, func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, fmt.Errorf("replay: %w", err)
	}
	return f, func() { f.Close() }, nil
}
