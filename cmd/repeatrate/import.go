package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/importer"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

const importUsage = `usage: repeatrate import inspect|opencompass|lm-eval --in PATH --workspace WS (--out FILE | --to-kafka BROKERS) [flags]
"repeatrate import inspect -h" (or opencompass, lm-eval) lists the flags.`

// skippedNote says how many files of a folder were skipped, when any were.
func skippedNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d files skipped, each said above with why)", n)
}

// importable refuses an import that found nothing to import: exit 1 with what to check, rather
// than "imported 0" and 0.
func importable(format, in string, evs []importer.Event, skipped int) error {
	if len(evs) == 0 && skipped > 0 {
		return fmt.Errorf("import %s: nothing imported from %s: each of the %d files or tasks found was skipped, for the reason said above", format, in, skipped)
	}
	if len(evs) == 0 {
		what := map[string]string{
			"inspect":     "an Inspect AI log (.eval or .json) or a folder of them",
			"opencompass": "an OpenCompass output folder (its results and predictions)",
			"lm-eval":     "an lm_eval --output_path folder written with --log_samples (results and samples files)",
		}[format]
		return fmt.Errorf("import %s: no eval results found in %s; it should be %s, and an interrupted or empty run has none", format, in, what)
	}
	return nil
}

// importCommand turns a harness's result files into eval-result events (README, "Importing eval
// results"): to an NDJSON file or straight to the eval-results topic.
func importCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprintln(stderr, importUsage)
		return flag.ErrHelp
	}
	read := map[string]func(string, importer.Options) ([]importer.Event, error){
		"inspect": importer.Inspect, "opencompass": importer.OpenCompass, "lm-eval": importer.LMEval,
	}
	if len(args) == 0 || read[args[0]] == nil {
		return fmt.Errorf("import: give a format, inspect, opencompass or lm-eval: %s", importUsage)
	}
	format := args[0]
	fs := newFlagSet("import "+format, stderr)
	in := fs.String("in", "", "result files: a log or directory (inspect), an output directory (opencompass, lm-eval)")
	var opt importer.Options
	fs.StringVar(&opt.Scope.Workspace, "workspace", "", "scope workspace (required)")
	fs.StringVar(&opt.Scope.Model, "model", "", "scope model (default: the files' model)")
	fs.StringVar(&opt.Scope.Run, "run", "", "scope run (default: the files' run id or timestamp)")
	fs.StringVar(&opt.Scope.Checkpoint, "checkpoint", "default", "scope checkpoint")
	fs.StringVar(&opt.Scope.Artifact, "artifact", "eval", "scope artifact")
	fs.StringVar(&opt.Suite, "suite", "", "suite (default: the task or dataset)")
	fs.StringVar(&opt.Version, "version", "", "suite version (default: <model>@<run>)")
	fs.Int64Var(&opt.VersionSeq, "version-seq", 0, "version order (default: the run's start, Unix seconds)")
	switch format { // each format's own flags: the others' -h does not list them
	case "inspect":
		opt.PassThreshold = fs.Float64("pass-threshold", 1, "a numeric score passes at or above it (C=1, P=0.5, I=N=0)")
		fs.StringVar(&opt.Scorer, "scorer", "", "scorer to read (default: the log's first)")
		fs.Int64Var(&opt.MaxMemberBytes, "max-member-bytes", importer.DefaultMaxMemberBytes, ".eval: most bytes one archive member may decompress to")
	case "lm-eval":
		opt.PassThreshold = fs.Float64("pass-threshold", 1, "a doc passes when the metric's value is at or above it (tasks scored once per doc)")
		fs.StringVar(&opt.Metric, "metric", "", "metric to read (default: exact_match, else acc); tasks with repeats need exact_match")
		fs.StringVar(&opt.Filter, "filter", "", "filter whose samples to read (default: none, else the first)")
	}
	toKafka := fs.String("to-kafka", "", "Kafka bootstrap brokers to publish to (comma-separated)")
	topic := fs.String("topic", TopicEval, "topic for --to-kafka")
	out := fs.String("out", "", "NDJSON file to write (- for standard output)")
	conn := kafkaConnectionFlags(fs, os.Getenv)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	var missing []string
	if *in == "" {
		missing = append(missing, "--in (the result files)")
	}
	if opt.Scope.Workspace == "" {
		missing = append(missing, "--workspace (the scope's workspace)")
	}
	if (*toKafka == "") == (*out == "") {
		missing = append(missing, "exactly one of --to-kafka (brokers) or --out (a file, - for standard output)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("import %s: missing %s", format, strings.Join(missing, ", "))
	}
	// The Kafka settings are checked before any file is read: a mistake in them is said at once.
	var kcfg KafkaConfig
	if *toKafka != "" {
		var err error
		if kcfg, err = conn(strings.Split(*toKafka, ",")); err != nil {
			return fmt.Errorf("import: %w", err)
		}
	}
	skipped := 0
	opt.Skipped = func(file, why string) {
		skipped++
		fmt.Fprintf(stderr, "skipped %s: %s\n", file, why)
	}
	// A progress line on a terminal (nothing off one): results made, files read of all.
	var prog *progress
	opt.Progress = func(results, done, total int) {
		if prog == nil {
			prog = newProgress(stderr, "import "+format, int64(total))
		}
		prog.set(int64(results), int64(done))
	}
	evs, err := read[format](*in, opt)
	if prog != nil {
		prog.finish()
	}
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	if err := importable(format, *in, evs, skipped); err != nil {
		return err
	}
	if *out != "" {
		w := stdout
		if *out != "-" {
			f, err := os.Create(*out)
			if err != nil {
				return fmt.Errorf("import: %w", err)
			}
			defer f.Close()
			w = f
		}
		for _, e := range evs {
			if _, err := fmt.Fprintf(w, "%s\n", e.Value); err != nil {
				return fmt.Errorf("import: %w", err)
			}
		}
		fmt.Fprintf(stderr, "imported %d eval results to %s%s\n", len(evs), *out, skippedNote(skipped))
		return nil
	}
	for _, w := range insecureWarnings(kcfg, nil) {
		fmt.Fprintln(stderr, "warning:", w)
	}
	kc, err := newKafkaClients(kcfg)
	if err != nil {
		return err
	}
	if err := kc.ensureTopics(ctx, []topicSpec{{name: *topic, partitions: 4}}); err != nil {
		return err
	}
	w := kc.writer(*topic)
	defer w.Close()
	msgs := make([]kafka.Message, 0, len(evs))
	for _, e := range evs {
		m := kafka.Message{Value: e.Value, Headers: []kafka.Header{{Key: "content-type", Value: []byte(sink.ContentType)}}}
		if e.Key != "" {
			m.Key = []byte(e.Key)
		}
		msgs = append(msgs, m)
	}
	for len(msgs) > 0 {
		n := min(len(msgs), 1000)
		if err := w.WriteMessages(ctx, msgs[:n]...); err != nil {
			return fmt.Errorf("import: %w", err)
		}
		msgs = msgs[n:]
	}
	fmt.Fprintf(stderr, "imported %d %s eval results to %s%s\n", len(evs), schemas.TypeEvalResult, *topic, skippedNote(skipped))
	return nil
}
