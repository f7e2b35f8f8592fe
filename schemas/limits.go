package schemas

// Size limits of what repeatrate accepts and publishes (docs/semantics.md#limits).
//
// Every field of an input event that reaches an output — a Kafka key, a CloudEvent subject or
// output data — is bounded, and so is every list an output holds, so that the largest output any
// valid input can cause fits Kafka's default message limit of 1 MiB (sink.MaxRecordBytes, checked
// against the topics' max.message.bytes at start). Input over a limit is dead-lettered with
// ReasonTooLarge (lengths) or ReasonBadValue (counts), never retried.
const (
	// MaxIdentityBytes is the longest accepted identity field, in bytes of UTF-8 (not characters):
	// each scope part (workspace, model, run, checkpoint, artifact), correction_id, opportunity_id,
	// suite, case_id and version. A byte of an aggregate's identity costs a snapshot record at
	// most 12 bytes (3 in the percent-escaped key, 3 in the subject, 6 in JSON data for a control
	// character), so the six text parts of an identity stay within 6·512·12 = 36,864 bytes; the
	// largest output, a stability snapshot, stays under 600 KB (sink's TestOutputLimits).
	MaxIdentityBytes = 512

	// MaxRuns is the most planned runs an eval result may declare (runs, so run_index < MaxRuns).
	// It bounds what a stability snapshot lists per version (one score per run) and what computing
	// it costs; larger values are dead-lettered with ReasonBadValue.
	MaxRuns = 10000

	// MaxListedCases is the most cases a suite snapshot lists: the discrimination snapshot's
	// revived case ids and the stability snapshot's missing_runs entries, the first ones in case
	// order. Their totals are reported beside them, so a subscriber sees when a list was cut.
	MaxListedCases = 100

	// MaxPassAtK is the most pass@k levels a stability snapshot reports (the processor's
	// configuration is checked against it); each k is at most MaxRuns.
	MaxPassAtK = 16

	// MaxFragmentBytes is the longest repeated fragment an abnormal-sample event quotes, in bytes;
	// a longer one is cut at a character boundary.
	MaxFragmentBytes = 200
)
