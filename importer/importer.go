package importer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// Options names what the files do not say, and overrides what they do.
type Options struct {
	// Scope of every event. Model and Run default to what the files name (Inspect: the log's model
	// and run id; OpenCompass: the model abbreviation and the output directory's timestamp).
	Scope schemas.Scope
	// Suite defaults to the task (Inspect) or the dataset abbreviation (OpenCompass).
	Suite string
	// Version defaults to the run (Scope.Run after defaults); VersionSeq, when 0, to the run's
	// start in Unix seconds (Inspect: eval.created; OpenCompass: the output directory's timestamp).
	Version    string
	VersionSeq int64
	// PassThreshold: a numeric score passes at or above it; nil means 1 (a pointer, so that 0 —
	// every non-negative score passes — can be asked for). Inspect's letter grades are C = 1,
	// P = 0.5, I = 0 and N = 0.
	PassThreshold *float64
	// Scorer picks one of an Inspect sample's scores by name; default the log's first scorer.
	Scorer string
	// Metric picks one of an lm_eval task's metrics by name; default exact_match, else acc, else
	// the task's first. Filter picks the samples of one of its filters; default none, else the first.
	Metric, Filter string
	// Source is the CloudEvent source; default "repeatrate-import/<format>".
	Source string
	// MaxMemberBytes caps the decompressed size of each member of an Inspect .eval archive
	// (default DefaultMaxMemberBytes): a member declaring more, or decompressing to more, fails the
	// import instead of exhausting memory (a few kilobytes of zstd can expand to gigabytes).
	MaxMemberBytes int64
	// Skipped, when set, is told of each file of a folder that is not a log of the format (a
	// stray JSON file beside the logs, say) and why; such a file does not stop the import. A file
	// named on its own that is not a log is an error.
	Skipped func(file, why string)
	// Progress, when set, is told after each file read how many results were made so far and
	// how many of the files were read (OpenCompass: results files, counted per run directory).
	Progress func(results, filesDone, filesTotal int)
}

// progress tells opt.Progress, when set.
func (opt Options) progress(results, done, total int) {
	if opt.Progress != nil {
		opt.Progress(results, done, total)
	}
}

// DefaultMaxMemberBytes is the default Options.MaxMemberBytes: far above an Inspect sample's JSON
// (its messages, events and scores), far below what a decompression bomb asks for.
const DefaultMaxMemberBytes = 256 << 20

// Event is one imported result: its CloudEvent id and the structured CloudEvent JSON.
type Event struct {
	ID    string
	Key   string // its Kafka key (cloudevent.Event.PartitionKey)
	Value []byte
}

type cloudEvent struct {
	SpecVersion     string             `json:"specversion"`
	ID              string             `json:"id"`
	Source          string             `json:"source"`
	Type            string             `json:"type"`
	DataContentType string             `json:"datacontenttype"`
	Time            string             `json:"time"`
	Data            schemas.EvalResult `json:"data"`
}

// clipPrediction cuts a reply to the decoder's prediction limit at a character boundary.
func clipPrediction(s string) string {
	limit := schemas.DefaultLimits.MaxPredictionBytes
	if len(s) <= limit {
		return s
	}
	// Back off to the start of the character the limit cuts (at most three bytes back).
	cut := limit
	for i := limit; i > 0 && i > limit-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			cut = i
			break
		}
	}
	return strings.ToValidUTF8(s[:cut], "")
}

// encoder validates and encodes events with the Kafka path's decoder.
type encoder struct {
	dec    *cloudevent.Decoder
	source string
	now    time.Time
}

func newEncoder(source string) (*encoder, error) {
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		return nil, err
	}
	return &encoder{dec: dec, source: source, now: time.Now()}, nil
}

// encode gives r a deterministic id (a hash of the source, the run's identity and when and how
// often it was assessed) and checks it. Importing the same files again gives the same ids; a run scored again
// (a later assessed_at) is another event, as CloudEvents wants of different content.
func (e *encoder) encode(r schemas.EvalResult) (Event, error) {
	h := sha256.New()
	for _, p := range []string{e.source, r.Scope.Workspace, r.Scope.Model, r.Scope.Run, r.Scope.Checkpoint,
		r.Scope.Artifact, r.Suite, r.CaseID, r.Version, strconv.FormatInt(r.RunIndex, 10), r.AssessedAt.UTC().Format(time.RFC3339Nano),
		strconv.FormatInt(r.AssessmentSeq, 10)} {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	id := hex.EncodeToString(h.Sum(nil)[:16])
	ce := cloudEvent{SpecVersion: "1.0", ID: id, Source: e.source, Type: schemas.TypeEvalResult,
		DataContentType: "application/json", Time: r.AssessedAt.UTC().Format(time.RFC3339Nano), Data: r}
	b, err := json.Marshal(ce)
	if err != nil {
		return Event{}, err
	}
	ev, err := e.dec.DecodeStructured(b, e.now)
	if err != nil {
		return Event{}, fmt.Errorf("case %q run %d: %w", r.CaseID, r.RunIndex, err)
	}
	// Keyed as the message `import` writes (the value and its content-type header) may be.
	m := kafka.Message{Value: b, Headers: []kafka.Header{{Key: "content-type", Value: []byte(sink.ContentType)}}}
	return Event{ID: id, Key: string(e.dec.MessageKey(ev, &m)), Value: b}, nil
}

func orDefault(v, def string) string {
	if v != "" {
		return v
	}
	return def
}
