package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/internal/synth"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// demoMix is the traffic of `dev --demo` and loadgen's default: a few scopes and corrections, with
// the faults real streams carry (internal/synth). The seed is the caller's.
var demoMix = synth.Config{Workspaces: 2, Corrections: 2, Duplicates: 0.1, Reassessed: 0.1, Poison: 0.02, EvalShare: 0.3}

// Load generation bounds.
const (
	// loadBatch is the most events one write carries; with the writer it bounds memory.
	loadBatch = 1000
	// loadMinWait is the shortest time between the starts of two writes that are not full: events
	// due sooner wait to share a write, so writes are at most 1/loadMinWait a second plus full ones.
	loadMinWait = 10 * time.Millisecond
	// loadBacklog is how far, in seconds of traffic, a sender that fell behind may catch up.
	loadBacklog = time.Second
	// loadWriteBudget bounds one write, which finishes even after Ctrl-C so the summary is exact.
	loadWriteBudget = 10 * time.Second
)

func loadgenCommand(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlagSet("loadgen", stderr)
	brokers := fs.String("brokers", "127.0.0.1:9092", "Kafka bootstrap brokers (comma-separated)")
	rate := fs.Int("rate", 100, "events per second")
	duration := fs.Duration("duration", 0, "how long to send (0: until interrupted)")
	live := fs.String("live-topic", TopicLive, "topic of live attempts (and poison)")
	eval := fs.String("eval-topic", TopicEval, "topic of evaluation results")
	seed := fs.Uint64("seed", 0, "generator seed (0: from the clock)")
	mix := fs.String("mix", "", "traffic mix overrides, e.g. poison=0.05,duplicates=0.2 (keys: "+strings.Join(mixKeys, ", ")+
		"; default: the demo's "+formatMix(demoMix)+")")
	conn := kafkaConnectionFlags(fs, os.Getenv)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rate <= 0 {
		return fmt.Errorf("loadgen: --rate %d: must be positive", *rate)
	}
	if *duration < 0 {
		return fmt.Errorf("loadgen: --duration %s: must not be negative", *duration)
	}
	m, err := parseMix(*mix, demoMix)
	if err != nil {
		return fmt.Errorf("loadgen: --mix: %w", err)
	}
	m.Seed = *seed
	if m.Seed == 0 {
		m.Seed = uint64(time.Now().UnixNano())
	}
	kcfg, err := conn(strings.Split(*brokers, ","))
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	for _, w := range insecureWarnings(kcfg, nil) {
		fmt.Fprintln(stderr, "warning:", w)
	}
	kc, err := newKafkaClients(kcfg)
	if err != nil {
		return err
	}
	// Missing topics are created with 4 partitions, like the processor's own input topics.
	if err := kc.ensureTopics(ctx, []topicSpec{{name: *live, partitions: 4}, {name: *eval, partitions: 4}}); err != nil {
		if ctx.Err() != nil {
			return nil // interrupted before sending anything
		}
		return fmt.Errorf("loadgen: %w", err)
	}
	w := kc.writer(*live)
	w.Topic = "" // each message names its topic
	defer w.Close()
	st, err := generateLoad(ctx, trafficConfig{Rate: *rate, Duration: *duration, Mix: m, LiveTopic: *live, EvalTopic: *eval}, w)
	fmt.Fprintln(stderr, st)
	return err
}

// mixKeys are the keys --mix accepts, in the order formatMix prints them.
var mixKeys = []string{"duplicates", "reassessed", "poison", "eval", "workspaces", "corrections"}

// parseMix applies comma-separated key=value overrides to base. Fractions are of all events and
// lie in [0, 1]; duplicates, re-assessments and poison together are at most 1.
func parseMix(s string, base synth.Config) (synth.Config, error) {
	c := base
	for _, kv := range strings.Split(s, ",") {
		if strings.TrimSpace(kv) == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok {
			return c, fmt.Errorf("%q: want key=value", kv)
		}
		switch k {
		case "workspaces", "corrections":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return c, fmt.Errorf("%s=%s: want a positive integer", k, v)
			}
			if k == "workspaces" {
				c.Workspaces = n
			} else {
				c.Corrections = n
			}
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return c, fmt.Errorf("%s=%s: want a fraction between 0 and 1", k, v)
		}
		switch k {
		case "duplicates":
			c.Duplicates = f
		case "reassessed":
			c.Reassessed = f
		case "poison":
			c.Poison = f
		case "eval":
			c.EvalShare = f
		default:
			return c, fmt.Errorf("unknown key %q (keys: %s)", k, strings.Join(mixKeys, ", "))
		}
	}
	if sum := c.Duplicates + c.Reassessed + c.Poison; sum > 1 {
		return c, fmt.Errorf("duplicates, reassessed and poison add up to %g, over 1", sum)
	}
	return c, nil
}

// formatMix prints a mix as parseMix reads it.
func formatMix(c synth.Config) string {
	return fmt.Sprintf("duplicates=%g,reassessed=%g,poison=%g,eval=%g,workspaces=%d,corrections=%d",
		c.Duplicates, c.Reassessed, c.Poison, c.EvalShare, c.Workspaces, c.Corrections)
}

// trafficConfig is one run of synthetic traffic.
type trafficConfig struct {
	Rate      int           // events per second, positive
	Duration  time.Duration // 0: until ctx ends
	Mix       synth.Config  // with its seed
	LiveTopic string        // live attempts and poison
	EvalTopic string        // evaluation results
	// OnWriteError decides what a failed write does: nil ends the run with the error; a function
	// returning nil drops the write's events and goes on (the demo logs and continues).
	OnWriteError func(error) error
	// OnSent, if set, is told the number of events of each successful write, as it happens.
	OnSent func(n int)
}

// loadStats is what a run of generateLoad sent.
type loadStats struct {
	Sent     int64         // events written
	Poison   int64         // of them, lines that must be dead-lettered
	Eval     int64         // of them, evaluation results
	Failed   int64         // events of failed writes that OnWriteError let pass
	Skipped  int64         // events the schedule dropped because the sender fell behind
	Target   int           // the requested rate
	Elapsed  time.Duration // from the start to the end of the last write
	Finished bool          // the duration ran out (rather than ctx ending)
}

// Rate is the achieved rate in events per second.
func (s loadStats) Rate() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Sent) / s.Elapsed.Seconds()
}

// String is loadgen's summary line.
func (s loadStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "loadgen: sent %d events (%d poison, %d eval results) in %s: %.1f events/s (target %d)",
		s.Sent, s.Poison, s.Eval, s.Elapsed.Round(time.Millisecond), s.Rate(), s.Target)
	if s.Skipped > 0 {
		fmt.Fprintf(&b, "; %d events skipped behind schedule", s.Skipped)
	}
	if s.Failed > 0 {
		fmt.Fprintf(&b, "; %d events in failed writes", s.Failed)
	}
	return b.String()
}

// generateLoad writes synthetic telemetry through w (a writer without a topic of its own: each
// message names one) at cfg.Rate until cfg.Duration has passed or ctx ends; either way is a
// success. Events are keyed by aggregate as produce keys them, evaluation results go to
// cfg.EvalTopic, everything else to cfg.LiveTopic. It holds at most loadBatch events at a time.
func generateLoad(ctx context.Context, cfg trafficConfig, w consumer.MessageWriter) (loadStats, error) {
	st := loadStats{Target: cfg.Rate}
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		return st, err
	}
	gen := synth.New(cfg.Mix)
	start := time.Now()
	p := newPacer(cfg.Rate, start, cfg.Duration)
	batch := make([]kafka.Message, 0, loadBatch)
	header := []kafka.Header{{Key: "content-type", Value: []byte(sink.ContentType)}}
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	sleep := func(d time.Duration) {
		timer.Reset(d)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	}
	var nextWrite time.Time // writes at most every loadMinWait, unless a full batch is due
	for ctx.Err() == nil {
		now := time.Now()
		if now.Before(nextWrite) {
			sleep(nextWrite.Sub(now))
			continue
		}
		n := p.take(now, loadBatch)
		if n == 0 {
			if p.finished(now) {
				st.Finished = true
				break
			}
			d := p.wait(now)
			if !p.end.IsZero() {
				d = min(d, p.end.Sub(now)) // now is before the end: finished says so
			}
			sleep(d)
			continue
		}
		if n < loadBatch {
			nextWrite = now.Add(loadMinWait)
		}
		batch = batch[:0]
		var poison, eval int64
		for range n {
			line, bad := gen.Line(now)
			m := kafka.Message{Topic: cfg.LiveTopic, Value: line, Headers: header}
			if bad {
				poison++
			} else if ev, err := dec.DecodeStructured(line, now); err == nil {
				m.Key = dec.MessageKey(ev, &m)
				if ev.Eval != nil {
					m.Topic = cfg.EvalTopic
					eval++
				}
			}
			batch = append(batch, m)
		}
		// The write finishes (within its budget) even when ctx ends meanwhile, so the summary
		// counts what the topics hold.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), loadWriteBudget)
		err := w.WriteMessages(wctx, batch...)
		cancel()
		st.Elapsed = time.Since(start)
		if err != nil {
			err = fmt.Errorf("loadgen: write %d events: %w", n, err)
			if cfg.OnWriteError == nil {
				return st, err
			}
			if err := cfg.OnWriteError(err); err != nil {
				return st, err
			}
			st.Failed += int64(n)
			continue
		}
		st.Sent += int64(n)
		st.Poison += poison
		st.Eval += eval
		if cfg.OnSent != nil {
			cfg.OnSent(n)
		}
	}
	st.Skipped = p.skipped
	if st.Sent == 0 {
		st.Elapsed = time.Since(start)
	}
	return st, nil
}

// pacer schedules events at a steady rate without drift: the n-th event after start is due at
// start + n/rate, whatever the delays of the wake-ups before it. A sender that fell behind (a slow
// broker) catches up with at most one loadBacklog of events; older ones are skipped and counted, so
// a long stall is followed by a bounded burst, not by minutes of sending flat out. Time is passed
// in: the pacer never reads a clock.
type pacer struct {
	rate     int64
	start    time.Time
	end      time.Time // zero: no end
	backlog  int64     // most due events take hands out at once, skipping older ones
	released int64     // events handed out or skipped
	skipped  int64
}

func newPacer(rate int, start time.Time, duration time.Duration) *pacer {
	p := &pacer{rate: int64(rate), start: start, backlog: max(1, int64(rate)*int64(loadBacklog)/int64(time.Second))}
	if duration > 0 {
		p.end = start.Add(duration)
	}
	return p
}

// scheduled is the number of events due by now: every event of [start, min(now, end)].
func (p *pacer) scheduled(now time.Time) int64 {
	if !p.end.IsZero() && now.After(p.end) {
		now = p.end
	}
	el := int64(now.Sub(p.start))
	if el < 0 {
		return 0
	}
	const s = int64(time.Second)
	return el/s*p.rate + el%s*p.rate/s // exact integer arithmetic, no overflow for sane rates
}

// take hands out up to limit due events and returns how many.
func (p *pacer) take(now time.Time, limit int) int {
	due := p.scheduled(now) - p.released
	if due > p.backlog {
		p.skipped += due - p.backlog
		p.released += due - p.backlog
		due = p.backlog
	}
	n := min(due, int64(limit))
	p.released += n
	return int(n)
}

// wait is the time from now until the next event is due (0 if one is due already).
func (p *pacer) wait(now time.Time) time.Duration {
	next := p.released + 1
	const s = int64(time.Second)
	// The least t with scheduled(start+t) >= next: whole seconds, then the rest rounded up.
	at := p.start.Add(time.Duration(next/p.rate*s + (next%p.rate*s+p.rate-1)/p.rate))
	return max(0, at.Sub(now))
}

// finished reports whether the run has an end, now is past it, and every event scheduled before it
// was handed out.
func (p *pacer) finished(now time.Time) bool {
	return !p.end.IsZero() && !now.Before(p.end) && p.released >= p.scheduled(p.end)
}
