package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/alert"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/ingest"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/schemas"
)

// Config is the processor's whole configuration. Precedence, lowest first: defaults, the YAML file
// (--config or REPEATRATE_CONFIG), REPEATRATE_* environment variables, flags.
type Config struct {
	Kafka     KafkaConfig   `yaml:"kafka"`
	Redis     RedisConfig   `yaml:"redis"`
	Retention time.Duration `yaml:"retention"`
	Batch     BatchConfig   `yaml:"batch"`
	Limits    LimitsConfig  `yaml:"limits"`
	Suite     SuiteConfig   `yaml:"suite"`
	HTTPAddr  string        `yaml:"http_addr"`
	HTTP      HTTPSettings  `yaml:"http"`
	Pprof     bool          `yaml:"pprof"`
	LogLevel  string        `yaml:"log_level"`
	// AlertRules is the alerting rules file; empty turns alerting off (README, Alerting).
	AlertRules string `yaml:"alert_rules"`
	// AlertmanagerURL is the Alertmanager that alerts are posted to; empty posts none.
	AlertmanagerURL string `yaml:"alertmanager_url"`
	// AlertWebhookURL receives firing and resolved alerts, signed with AlertWebhookSecret
	// (HMAC-SHA256; README, Alerting); empty posts none. The secret is never logged.
	AlertWebhookURL    string `yaml:"alert_webhook_url"`
	AlertWebhookSecret string `yaml:"alert_webhook_secret"`
}

// KafkaConfig says where events come from and where results go.
type KafkaConfig struct {
	Brokers       []string      `yaml:"brokers"`
	GroupID       string        `yaml:"group_id"`
	InputTopics   []string      `yaml:"input_topics"`
	SnapshotTopic string        `yaml:"snapshot_topic"`
	SuiteTopic    string        `yaml:"suite_topic"`
	AlertsTopic   string        `yaml:"alerts_topic"`
	DLQTopic      string        `yaml:"dlq_topic"`
	CreateTopics  bool          `yaml:"create_topics"`
	Session       time.Duration `yaml:"session_timeout"`
	// Compression is the codec of every record batch this process writes: none, gzip, snappy,
	// lz4 or zstd. Consumers decompress whatever they read, so it can differ per writer.
	Compression string     `yaml:"compression"`
	TLS         TLSConfig  `yaml:"tls"`
	SASL        SASLConfig `yaml:"sasl"`
}

// SASLConfig selects Kafka SASL authentication: mechanism plain, scram-sha-256 or scram-sha-512.
type SASLConfig struct {
	Mechanism string `yaml:"mechanism"`
	Username  string `yaml:"username"`
	Password  string `yaml:"password"`
}

// TLSConfig turns TLS on for a connection; files are PEM.
type TLSConfig struct {
	Enabled            bool   `yaml:"enabled"`
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// RedisConfig says where state lives. Several addresses mean Redis Cluster.
type RedisConfig struct {
	Addrs     []string  `yaml:"addrs"`
	Username  string    `yaml:"username"`
	Password  string    `yaml:"password"`
	DB        int       `yaml:"db"`
	KeyPrefix string    `yaml:"key_prefix"`
	TLS       TLSConfig `yaml:"tls"`
	// WaitReplicas, when positive, holds every offset commit until that many replicas of each
	// primary the batches wrote acknowledged the writes (Redis WAIT), for at most WaitTimeout.
	WaitReplicas int           `yaml:"wait_replicas"`
	WaitTimeout  time.Duration `yaml:"wait_timeout"`
	// StateLayout is the layout a namespace is created in (a new installation, a rebuild): 10, or
	// 11 for about a third of the memory per retained opportunity at more processor CPU and a
	// higher latency at load (aggregator.Layout11). A namespace keeps the layout it was created in.
	StateLayout int `yaml:"state_layout"`
	// ComputeCalls (on by default) makes the processor compute the commonest calls (new records,
	// duplicates, reassessments in place; both layouts) itself and store them through a script that checks nothing it read
	// changed, instead of running the apply script on Redis's one thread (docs/performance.md).
	ComputeCalls bool `yaml:"compute_calls"`
	// BucketCacheBytes bounds the layout-11 buckets the processor holds in place of reading them
	// again (aggregator.RedisConfig.BucketCacheBytes): enough for the buckets of the aggregates in
	// use, or their calls read them from Redis every time (repeatrate_bucket_cache_evictions_total).
	BucketCacheBytes int `yaml:"bucket_cache_bytes"`
}

// BatchConfig bounds a processing batch.
type BatchConfig struct {
	MaxMessages int           `yaml:"max_messages"`
	MaxBytes    int           `yaml:"max_bytes"`
	Linger      time.Duration `yaml:"linger"`
	CommitDelay time.Duration `yaml:"commit_delay"`
	MaxInFlight int           `yaml:"max_in_flight"`
}

// SuiteConfig configures suite discrimination and repeated-sampling stability (docs/semantics.md#discrimination, #stability).
type SuiteConfig struct {
	MinHistory        int           `yaml:"min_history"`
	JudgeLastVersions int           `yaml:"judge_last_versions"`
	PassAtK           []string      `yaml:"pass_at_k"`
	ReplyMode         string        `yaml:"reply_mode"`
	Tokenizer         string        `yaml:"tokenizer"`
	MissingAfter      time.Duration `yaml:"missing_after"`
}

// HTTPSettings secure the read side (README, Read side): tokens as SHA-256 hashes with their
// workspaces, public badges, the admin token of /metrics and /debug/pprof, and request limits.
type HTTPSettings struct {
	Tokens           []auth.TokenConfig `yaml:"tokens"`
	PublicBadges     []string           `yaml:"public_badges"`
	Metrics          bool               `yaml:"metrics"`
	AdminTokenSHA256 string             `yaml:"admin_token_sha256"`
	RateLimit        int                `yaml:"rate_limit"`
	// ReadBudget is the Redis commands per second each token's reads may send (default 200, in
	// bursts of ten times that); MaxReadsInFlight the reads one token runs at once (default 4).
	ReadBudget       int `yaml:"read_budget"`
	MaxReadsInFlight int `yaml:"max_reads_in_flight"`
	MaxConnections   int `yaml:"max_connections"`
	// MaxConnectionsPerAddress caps one client address's connections (default 32). Behind a
	// proxy or Ingress every client has the proxy's address: raise it to max_connections there.
	MaxConnectionsPerAddress int `yaml:"max_connections_per_address"`
	// ProbeAddr serves /healthz and /readyz on a listener of their own, outside the connection
	// caps, so that a client holding every API slot cannot fail the probes (empty: only on
	// http_addr).
	ProbeAddr string `yaml:"probe_addr"`
	// Ingest (POST /v1/events, README, Ingest over HTTP): the input topics live attempts and eval
	// results are written to (empty: the first input topic, and the second when there is one),
	// the body limit, and the record bytes of Kafka writes not yet finished (past it, 503).
	IngestLiveTopic        string `yaml:"ingest_live_topic"`
	IngestEvalTopic        string `yaml:"ingest_eval_topic"`
	IngestMaxBodyBytes     int    `yaml:"ingest_max_body_bytes"`
	IngestMaxInFlightBytes int    `yaml:"ingest_max_inflight_bytes"`
	// IngestWorkspaceRate is the events per second one workspace may post (default 5 000, in
	// bursts of ten times that); past it a request is answered 429, nothing of it written.
	IngestWorkspaceRate int `yaml:"ingest_workspace_rate"`
	// IngestWorkspaceRetained is the retained opportunities one workspace may hold before its
	// events are refused (default 10 000 000, about 1.4 GB of Redis; 0: no quota).
	IngestWorkspaceRetained int `yaml:"ingest_workspace_retained"`
}

// ingestTopics are the input topics the HTTP ingest writes live attempts and eval results to.
func (c *Config) ingestTopics() (live, eval string) {
	live, eval = c.HTTP.IngestLiveTopic, c.HTTP.IngestEvalTopic
	if n := len(c.Kafka.InputTopics); n > 0 {
		if live == "" {
			live = c.Kafka.InputTopics[0]
		}
		if eval == "" {
			eval = c.Kafka.InputTopics[min(1, n-1)]
		}
	}
	return live, eval
}

// LimitsConfig bounds accepted input.
type LimitsConfig struct {
	MaxMessageBytes    int           `yaml:"max_message_bytes"`
	MaxPredictionBytes int           `yaml:"max_prediction_bytes"`
	MaxFutureSkew      time.Duration `yaml:"max_future_skew"`
}

// Default topic names (README, Input and output).
const (
	TopicLive      = "telemetry.live-attempts"
	TopicEval      = "telemetry.eval-results"
	TopicSnapshots = "repeatrate.snapshots"
	TopicSuites    = "repeatrate.suite-snapshots"
	TopicAlerts    = "repeatrate.alerts"
	TopicDLQ       = "repeatrate.dlq"
)

func defaultConfig() Config {
	return Config{
		Kafka: KafkaConfig{
			Brokers: []string{"127.0.0.1:9092"}, GroupID: "repeatrate",
			InputTopics: []string{TopicLive, TopicEval}, Session: 10 * time.Second, Compression: "none",
			SnapshotTopic: TopicSnapshots, SuiteTopic: TopicSuites, AlertsTopic: TopicAlerts, DLQTopic: TopicDLQ,
		},
		Suite: SuiteConfig{MinHistory: 5, PassAtK: []string{"1", "5", "10"}, ReplyMode: "default", Tokenizer: "whitespace", MissingAfter: time.Hour},
		Redis: RedisConfig{Addrs: []string{"127.0.0.1:6379"}, KeyPrefix: "rr", WaitTimeout: aggregator.DefaultWaitTimeout, StateLayout: int(aggregator.Layout10),
			ComputeCalls: true, BucketCacheBytes: aggregator.DefaultBucketCacheBytes},
		Retention: 30 * 24 * time.Hour,
		Batch:     BatchConfig{MaxMessages: consumer.DefaultMaxBatch, MaxBytes: consumer.DefaultMaxBatchBytes, Linger: 20 * time.Millisecond, CommitDelay: 2 * time.Second, MaxInFlight: consumer.DefaultMaxInFlight},
		Limits:    LimitsConfig{MaxMessageBytes: 1 << 20, MaxPredictionBytes: 64 << 10, MaxFutureSkew: 5 * time.Minute},
		HTTPAddr:  "127.0.0.1:8080",
		HTTP: HTTPSettings{Metrics: true, RateLimit: 20, ReadBudget: 200, MaxReadsInFlight: 4, IngestWorkspaceRate: 5000, IngestWorkspaceRetained: 10_000_000, MaxConnections: 256, MaxConnectionsPerAddress: 32, IngestMaxBodyBytes: 1 << 20,
			IngestMaxInFlightBytes: ingest.DefaultMaxInFlightBytes},
		LogLevel: "info",
	}
}

// Validate reports every configuration error at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(f, a...)) }
	if len(c.Kafka.Brokers) == 0 {
		bad("kafka.brokers: at least one broker is required")
	}
	if c.Kafka.GroupID == "" {
		bad("kafka.group_id is required")
	}
	if len(c.Kafka.InputTopics) == 0 {
		bad("kafka.input_topics: at least one topic is required")
	}
	outputs := map[string]bool{}
	for _, t := range []string{c.Kafka.SnapshotTopic, c.Kafka.SuiteTopic, c.Kafka.AlertsTopic, c.Kafka.DLQTopic} {
		if t == "" || outputs[t] {
			bad("kafka.snapshot_topic, suite_topic, alerts_topic and dlq_topic are required and distinct")
			break
		}
		outputs[t] = true
	}
	for _, t := range c.Kafka.InputTopics {
		if outputs[t] {
			bad("kafka.input_topics: %q is also an output topic", t)
		}
	}
	if _, err := c.Suite.aggregator(); err != nil {
		bad("suite: %v", err)
	}
	switch strings.ToLower(c.Kafka.SASL.Mechanism) {
	case "":
	case "plain", "scram-sha-256", "scram-sha-512":
		if c.Kafka.SASL.Username == "" {
			bad("kafka.sasl.username is required with mechanism %s", c.Kafka.SASL.Mechanism)
		}
	default:
		bad("kafka.sasl.mechanism %q is not plain, scram-sha-256 or scram-sha-512", c.Kafka.SASL.Mechanism)
	}
	if len(c.Redis.Addrs) == 0 {
		bad("redis.addrs: at least one address is required")
	}
	if c.Redis.WaitReplicas < 0 || c.Redis.WaitTimeout < 0 || (c.Redis.WaitTimeout > 0 && c.Redis.WaitTimeout < time.Millisecond) {
		bad("redis.wait_replicas must not be negative and redis.wait_timeout must be 0 (the default, 1s) or at least 1ms")
	}
	if err := aggregator.Layout(c.Redis.StateLayout).Validate(); err != nil {
		bad("redis.state_layout: %v", err)
	}
	if c.Redis.BucketCacheBytes < 1<<20 {
		bad("redis.bucket_cache_bytes %d must be at least 1 MiB (%d)", c.Redis.BucketCacheBytes, 1<<20)
	}
	if c.Retention < time.Hour {
		bad("retention %s is too short: it must exceed the input topics' retention", c.Retention)
	}
	if c.Batch.MaxMessages <= 0 || c.Batch.MaxBytes <= 0 || c.Batch.Linger <= 0 || c.Batch.CommitDelay < 0 || c.Batch.MaxInFlight <= 0 {
		bad("batch.max_messages, batch.max_bytes, batch.linger and batch.max_in_flight must be positive, batch.commit_delay not negative")
	}
	if _, err := compressionCodec(c.Kafka.Compression); err != nil {
		bad("kafka.compression: %v", err)
	}
	if c.Kafka.Session < 6*time.Second {
		bad("kafka.session_timeout %s is below the broker minimum of 6s", c.Kafka.Session)
	}
	if c.Limits.MaxMessageBytes <= 0 || c.Limits.MaxPredictionBytes <= 0 || c.Limits.MaxFutureSkew < 0 {
		bad("limits must be positive")
	}
	if c.Limits.MaxFutureSkew > aggregator.MaxFutureSkew {
		bad("limits.max_future_skew %s is above %s: the store keeps minute buckets for the 1h window plus that much skew",
			c.Limits.MaxFutureSkew, aggregator.MaxFutureSkew)
	}
	if c.Pprof && c.HTTP.AdminTokenSHA256 == "" {
		bad("pprof: /debug/pprof needs http.admin_token_sha256 (--http-admin-token-sha256): without it anyone who reaches the port could profile the process")
	}
	if c.AlertWebhookURL != "" && len(c.AlertWebhookSecret) < alert.MinWebhookSecret {
		bad("alert_webhook_secret: the webhook needs a secret of at least %d bytes", alert.MinWebhookSecret)
	}
	if _, err := auth.NewStore(c.HTTP.Tokens); err != nil {
		bad("http.tokens: %v", err)
	}
	if c.HTTP.RateLimit <= 0 || c.HTTP.ReadBudget <= 0 || c.HTTP.MaxReadsInFlight <= 0 || c.HTTP.MaxConnections <= 0 ||
		c.HTTP.MaxConnectionsPerAddress <= 0 || c.HTTP.IngestMaxBodyBytes <= 0 || c.HTTP.IngestMaxInFlightBytes <= 0 || c.HTTP.IngestWorkspaceRate <= 0 {
		bad("http.rate_limit, http.read_budget, http.max_reads_in_flight, http.max_connections, http.max_connections_per_address, http.ingest_max_body_bytes, http.ingest_max_inflight_bytes and http.ingest_workspace_rate must be positive")
	}
	if c.HTTP.IngestWorkspaceRetained < 0 {
		bad("http.ingest_workspace_retained must not be negative (0: no quota)")
	}
	if c.HTTP.IngestMaxInFlightBytes > 0 && c.HTTP.IngestMaxInFlightBytes < 2*c.HTTP.IngestMaxBodyBytes {
		bad("http.ingest_max_inflight_bytes %d is below twice http.ingest_max_body_bytes %d: a largest request would wait for an empty budget",
			c.HTTP.IngestMaxInFlightBytes, c.HTTP.IngestMaxBodyBytes)
	}
	// The ingest must write where the processor reads.
	for _, t := range []string{c.HTTP.IngestLiveTopic, c.HTTP.IngestEvalTopic} {
		if t != "" && !slices.Contains(c.Kafka.InputTopics, t) {
			bad("http.ingest_live_topic and ingest_eval_topic: %q is not an input topic", t)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level %q is not debug, info, warn or error", c.LogLevel)
	}
	return errors.Join(errs...)
}

// setting binds one configuration value to a flag and an environment variable.
type setting struct {
	name  string // flag name; the variable is REPEATRATE_ + upper(name with - as _)
	usage string
	set   func(string) error
	get   func() string
	bool  bool
}

func (s setting) env() string {
	return "REPEATRATE_" + strings.ToUpper(strings.ReplaceAll(s.name, "-", "_"))
}

// settings lists every value that flags and environment can set.
func (c *Config) settings() []setting {
	str := func(name, usage string, p *string) setting {
		return setting{name: name, usage: usage, set: func(v string) error { *p = v; return nil }, get: func() string { return *p }}
	}
	list := func(name, usage string, p *[]string) setting {
		return setting{name: name, usage: usage + " (comma-separated)", set: func(v string) error {
			*p = nil
			for _, s := range strings.Split(v, ",") {
				if s = strings.TrimSpace(s); s != "" {
					*p = append(*p, s)
				}
			}
			return nil
		}, get: func() string { return strings.Join(*p, ",") }}
	}
	dur := func(name, usage string, p *time.Duration) setting {
		return setting{name: name, usage: usage, set: func(v string) error {
			d, err := parseDuration(v)
			*p = d
			return err
		}, get: func() string { return p.String() }}
	}
	num := func(name, usage string, p *int) setting {
		return setting{name: name, usage: usage, set: func(v string) error {
			n, err := strconv.Atoi(v)
			*p = n
			return err
		}, get: func() string { return strconv.Itoa(*p) }}
	}
	boolean := func(name, usage string, p *bool) setting {
		return setting{name: name, usage: usage, bool: true, set: func(v string) error {
			b, err := strconv.ParseBool(v)
			*p = b
			return err
		}, get: func() string { return strconv.FormatBool(*p) }}
	}
	return []setting{
		list("kafka-brokers", "Kafka bootstrap brokers", &c.Kafka.Brokers),
		str("kafka-group-id", "consumer group id", &c.Kafka.GroupID),
		list("kafka-input-topics", "input topics", &c.Kafka.InputTopics),
		str("kafka-snapshot-topic", "snapshot topic", &c.Kafka.SnapshotTopic),
		str("kafka-suite-topic", "suite snapshot topic", &c.Kafka.SuiteTopic),
		str("kafka-alerts-topic", "alerts topic (revived cases, abnormal samples)", &c.Kafka.AlertsTopic),
		str("kafka-dlq-topic", "dead-letter topic", &c.Kafka.DLQTopic),
		dur("kafka-session-timeout", "consumer group session timeout", &c.Kafka.Session),
		str("kafka-compression", "codec of the record batches this process writes: none, gzip, snappy, lz4 or zstd", &c.Kafka.Compression),
		boolean("kafka-create-topics", "create missing topics at start (snapshot topic compacted)", &c.Kafka.CreateTopics),
		boolean("kafka-tls", "use TLS to Kafka", &c.Kafka.TLS.Enabled),
		str("kafka-tls-ca-file", "PEM CA bundle for Kafka", &c.Kafka.TLS.CAFile),
		str("kafka-tls-cert-file", "PEM client certificate for Kafka", &c.Kafka.TLS.CertFile),
		str("kafka-tls-key-file", "PEM client key for Kafka", &c.Kafka.TLS.KeyFile),
		str("kafka-tls-server-name", "name the Kafka brokers' certificates must carry (default: the host dialled)", &c.Kafka.TLS.ServerName),
		boolean("kafka-tls-insecure-skip-verify", "accept any Kafka broker certificate (testing only: anyone on the path can read and change the traffic; logged as a warning)", &c.Kafka.TLS.InsecureSkipVerify),
		str("kafka-sasl-mechanism", "plain, scram-sha-256 or scram-sha-512", &c.Kafka.SASL.Mechanism),
		str("kafka-sasl-username", "Kafka SASL user", &c.Kafka.SASL.Username),
		str("kafka-sasl-password", "Kafka SASL password (prefer the environment variable)", &c.Kafka.SASL.Password),
		list("redis-addrs", "Redis address; several mean Redis Cluster", &c.Redis.Addrs),
		str("redis-username", "Redis ACL user", &c.Redis.Username),
		str("redis-password", "Redis password (prefer the environment variable)", &c.Redis.Password),
		num("redis-db", "Redis database (not with Cluster)", &c.Redis.DB),
		str("redis-key-prefix", "prefix of every Redis key", &c.Redis.KeyPrefix),
		num("redis-wait-replicas", "replicas of every primary a batch wrote that must acknowledge its writes (Redis WAIT) before its offsets are committed; 0 relies on the commit delay", &c.Redis.WaitReplicas),
		dur("redis-wait-timeout", "how long to wait for those replicas per commit; fewer in time means no commit yet", &c.Redis.WaitTimeout),
		num("redis-state-layout", "state layout of a namespace created from now on (a new installation, a rebuild): 10, or 11 for a third of the memory per opportunity at more processor CPU and a higher latency at load; a namespace keeps its own", &c.Redis.StateLayout),
		boolean("redis-compute-calls", "compute the commonest calls (new records, duplicates) in the processor and store them checked, instead of the apply script: less Redis CPU, one more round trip a batch (two in layout 11 when a store's shape is not the one expected)", &c.Redis.ComputeCalls),
		num("redis-bucket-cache-bytes", "bytes of layout 11's buckets the processor holds in place of reading them again; past it calls read them from Redis (repeatrate_bucket_cache_evictions_total rises)", &c.Redis.BucketCacheBytes),
		boolean("redis-tls", "use TLS to Redis", &c.Redis.TLS.Enabled),
		str("redis-tls-ca-file", "PEM CA bundle for Redis", &c.Redis.TLS.CAFile),
		str("redis-tls-cert-file", "PEM client certificate for Redis (tls-auth-clients)", &c.Redis.TLS.CertFile),
		str("redis-tls-key-file", "PEM client key for Redis", &c.Redis.TLS.KeyFile),
		str("redis-tls-server-name", "name the Redis servers' certificates must carry (default: the host dialled)", &c.Redis.TLS.ServerName),
		boolean("redis-tls-insecure-skip-verify", "accept any Redis server certificate (testing only; logged as a warning)", &c.Redis.TLS.InsecureSkipVerify),
		dur("retention", "how long opportunity identities are kept (e.g. 30d); must exceed input topic retention", &c.Retention),
		num("batch-max-messages", "messages per batch at most (under load; batch-linger bounds a batch's wait)", &c.Batch.MaxMessages),
		num("batch-max-bytes", "bytes of message keys and values per batch at most", &c.Batch.MaxBytes),
		dur("batch-linger", "longest wait to fill a batch", &c.Batch.Linger),
		num("batch-max-in-flight", "batches decoded, applied and published at once (1: one stage after another)", &c.Batch.MaxInFlight),
		dur("batch-commit-delay", "hold offsets this long after their batch is applied, until Redis has fsynced it (AOF everysec: ≥ 1s; 0 with WAIT-free setups that accept loss)", &c.Batch.CommitDelay),
		num("max-message-bytes", "largest accepted message", &c.Limits.MaxMessageBytes),
		num("max-prediction-bytes", "largest accepted prediction text", &c.Limits.MaxPredictionBytes),
		dur("max-future-skew", "how far occurred_at may lie in the future", &c.Limits.MaxFutureSkew),
		num("suite-min-history", "versions with an outcome before a case is judged", &c.Suite.MinHistory),
		num("suite-judge-last-versions", "judge cases over only the last R versions (0: all)", &c.Suite.JudgeLastVersions),
		list("suite-pass-at-k", "pass@k levels", &c.Suite.PassAtK),
		str("suite-reply-mode", "reply repetition rules: default or opencompass", &c.Suite.ReplyMode),
		str("suite-tokenizer", "what reply analysis counts as a token: whitespace, o200k_base or cl100k_base (tiktoken, offline)", &c.Suite.Tokenizer),
		dur("suite-missing-after", "planned runs count as missing this long after a case's first run", &c.Suite.MissingAfter),
		str("alert-rules", "alerting rules file (YAML); empty disables alerting", &c.AlertRules),
		str("alertmanager-url", "Alertmanager base URL alerts are posted to (http://host:9093); empty posts none", &c.AlertmanagerURL),
		str("alert-webhook-url", "URL that firing and resolved alerts are posted to, signed (HMAC-SHA256); empty posts none", &c.AlertWebhookURL),
		str("alert-webhook-secret", "the webhook's signing secret, at least 16 bytes (prefer the environment variable)", &c.AlertWebhookSecret),
		str("http-addr", "HTTP listen address (health, metrics, API); empty disables", &c.HTTPAddr),
		boolean("pprof", "serve /debug/pprof on the HTTP address (exposes internals; off by default)", &c.Pprof),
		{name: "http-tokens", usage: "read-side tokens as name:sha256:workspace=read,…;… (replaces http.tokens; the hashes, never the tokens)",
			set: func(v string) (err error) { c.HTTP.Tokens, err = auth.ParseTokens(v); return err },
			get: func() string { return "" }},
		list("http-public-badges", "workspaces whose badge needs no token", &c.HTTP.PublicBadges),
		boolean("http-metrics", "serve /metrics (default true; behind http-admin-token-sha256 when set)", &c.HTTP.Metrics),
		str("http-admin-token-sha256", "SHA-256 (hex) of the token /metrics and /debug/pprof require; empty leaves /metrics open", &c.HTTP.AdminTokenSHA256),
		num("http-rate-limit", "requests per second per token (or client address without one)", &c.HTTP.RateLimit),
		num("http-read-budget", "Redis commands per second the reads of one token (or client address without one) may send, in bursts of ten times that; past it 429", &c.HTTP.ReadBudget),
		num("http-max-reads-in-flight", "reads one token (or client address without one) runs at once at most (live streams and ingest aside); past it 429", &c.HTTP.MaxReadsInFlight),
		num("http-max-connections", "open HTTP connections at most", &c.HTTP.MaxConnections),
		num("http-max-connections-per-address", "open HTTP connections of one client address at most (behind a proxy or Ingress: raise to http-max-connections)", &c.HTTP.MaxConnectionsPerAddress),
		str("http-probe-addr", "listen address of /healthz and /readyz alone, outside the connection caps (point Kubernetes probes there); empty: only on http-addr", &c.HTTP.ProbeAddr),
		str("http-ingest-live-topic", "input topic POST /v1/events writes live attempts to (empty: the first input topic)", &c.HTTP.IngestLiveTopic),
		str("http-ingest-eval-topic", "input topic POST /v1/events writes eval results to (empty: the second input topic, else the first)", &c.HTTP.IngestEvalTopic),
		num("http-ingest-max-body-bytes", "largest body POST /v1/events accepts (larger: 413)", &c.HTTP.IngestMaxBodyBytes),
		num("http-ingest-max-inflight-bytes", "record bytes of /v1/events writes to Kafka not yet finished (answered or not) at most; past it a request is answered 503 before anything is sent", &c.HTTP.IngestMaxInFlightBytes),
		num("http-ingest-workspace-rate", "events per second one workspace may post to /v1/events, in bursts of ten times that; past it 429, nothing of the request written", &c.HTTP.IngestWorkspaceRate),
		num("http-ingest-workspace-retained", "retained opportunities one workspace may hold; at it, its posts to /v1/events are answered 429 (0: no quota)", &c.HTTP.IngestWorkspaceRetained),
		str("log-level", "debug, info, warn or error", &c.LogLevel),
	}
}

// devToken gives cfg one freshly generated token that reads and writes every workspace (the read
// side and POST /v1/events), for `dev`, and returns it: only its hash is configured, and the token
// is shown once, to the person who started dev.
func devToken(cfg *Config) (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	tok := "rr_dev_" + hex.EncodeToString(b)
	cfg.HTTP.Tokens = append(cfg.HTTP.Tokens, auth.TokenConfig{Name: "dev", SHA256: auth.Hash(tok),
		Workspaces: map[string]string{auth.AllWorkspaces: "read-write"}})
	return tok, nil
}

// aggregator converts the suite settings.
func (s SuiteConfig) aggregator() (suite.Config, error) {
	out := suite.Config{MinHistory: s.MinHistory, JudgeLastVersions: s.JudgeLastVersions, MissingAfter: s.MissingAfter}
	if s.MinHistory < 1 || s.JudgeLastVersions < 0 || s.MissingAfter <= 0 {
		return out, fmt.Errorf("min_history must be ≥ 1, judge_last_versions ≥ 0, missing_after positive")
	}
	// Bounded so that a stability snapshot stays within its record limit (docs/semantics.md#limits).
	if len(s.PassAtK) > schemas.MaxPassAtK {
		return out, fmt.Errorf("pass_at_k lists %d levels, at most %d", len(s.PassAtK), schemas.MaxPassAtK)
	}
	for _, k := range s.PassAtK {
		n, err := strconv.Atoi(k)
		if err != nil || n < 1 || n > schemas.MaxRuns {
			return out, fmt.Errorf("pass_at_k %q is not an integer in 1..%d", k, schemas.MaxRuns)
		}
		out.Ks = append(out.Ks, n)
	}
	switch s.ReplyMode {
	case "default":
		out.ReplyMode = suite.ReplyDefault
	case "opencompass":
		out.ReplyMode = suite.ReplyOpenCompass
	default:
		return out, fmt.Errorf("reply_mode %q is not default or opencompass", s.ReplyMode)
	}
	tok, err := suite.ParseTokenizer(s.Tokenizer)
	if err != nil {
		return out, err
	}
	if err := tok.Load(); err != nil {
		return out, err
	}
	out.ReplyMode = out.ReplyMode.WithTokenizer(tok)
	return out, out.Validate()
}

// parseDuration accepts Go durations plus a whole number of days ("30d").
func parseDuration(v string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil {
			return 0, fmt.Errorf("duration %q: %w", v, err)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(v)
}

// loadConfig builds the configuration from defaults, file, environment and flags, in that order,
// with a flag for every setting (run's).
func loadConfig(fs *flag.FlagSet, args []string, getenv func(string) string) (Config, error) {
	return loadConfigFor(fs, args, getenv, nil)
}

// commandSettings says which settings a subcommand other than run takes as flags (its -h lists
// only those); the file and the environment still set any, since a deployment shares one
// configuration between its commands.
var commandSettings = map[string]func(name string) bool{
	// The evaluator alone: Kafka to read the output topics and publish alerts, Redis for its
	// state, its rules and sinks, and the address of its metrics.
	"alert": func(n string) bool {
		if strings.HasPrefix(n, "redis-wait") {
			return false
		}
		for _, p := range []string{"kafka-brokers", "kafka-snapshot-topic", "kafka-suite-topic", "kafka-alerts-topic",
			"kafka-tls", "kafka-sasl", "redis-", "alert", "http-addr", "log-level"} {
			if strings.HasPrefix(n, p) {
				return true
			}
		}
		return false
	},
	// A migration works on Redis alone.
	"migrate": func(n string) bool {
		return (strings.HasPrefix(n, "redis-") && !strings.HasPrefix(n, "redis-wait") && n != "redis-state-layout") || n == "log-level"
	},
	// A rebuild applies the input as the processor does, without the read side and alerting.
	"rebuild": func(n string) bool {
		for _, p := range []string{"alert", "http-", "pprof", "batch-max", "batch-linger"} {
			if strings.HasPrefix(n, p) {
				return false
			}
		}
		return true
	},
}

// loadConfigFor is loadConfig with flags only for the settings keep takes (nil: all).
func loadConfigFor(fs *flag.FlagSet, args []string, getenv func(string) string, keep func(string) bool) (Config, error) {
	cfg := defaultConfig()
	file := fs.String("config", getenv("REPEATRATE_CONFIG"), "YAML configuration file")
	flagVals := map[string]*string{}
	flagBools := map[string]*bool{}
	for _, s := range cfg.settings() {
		if keep != nil && !keep(s.name) {
			continue
		}
		if s.bool {
			flagBools[s.name] = fs.Bool(s.name, false, s.usage+" (env "+s.env()+")")
		} else {
			flagVals[s.name] = fs.String(s.name, "", s.usage+" (env "+s.env()+", default "+s.get()+")")
		}
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if *file != "" {
		b, err := os.ReadFile(*file)
		if err != nil {
			return Config{}, fmt.Errorf("config file: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", *file, err)
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, s := range cfg.settings() {
		if v := getenv(s.env()); v != "" {
			if err := s.set(v); err != nil {
				return Config{}, fmt.Errorf("%s: %w", s.env(), err)
			}
		}
		if !set[s.name] {
			continue
		}
		v := ""
		if s.bool {
			v = strconv.FormatBool(*flagBools[s.name])
		} else {
			v = *flagVals[s.name]
		}
		if err := s.set(v); err != nil {
			return Config{}, fmt.Errorf("--%s: %w", s.name, err)
		}
	}
	return cfg, cfg.Validate()
}

// insecureWarnings names each connection whose TLS certificate checks are off
// (insecure_skip_verify): the processor logs them as warnings at start, produce and tail print them.
func insecureWarnings(k KafkaConfig, r *RedisConfig) []string {
	var w []string
	if k.TLS.Enabled && k.TLS.InsecureSkipVerify {
		w = append(w, "kafka TLS certificate verification is off (kafka.tls.insecure_skip_verify): anyone on the path can read and change the traffic")
	}
	if r != nil && r.TLS.Enabled && r.TLS.InsecureSkipVerify {
		w = append(w, "redis TLS certificate verification is off (redis.tls.insecure_skip_verify): anyone on the path can read and change the traffic")
	}
	return w
}

// kafkaConnectionFlags registers on fs the Kafka connection settings every subcommand that talks
// to Kafka takes beside --brokers (TLS, SASL and the writers' compression, the same names and
// REPEATRATE_* variables as run's). The returned function, called after fs.Parse, applies the environment and then the
// flags, and returns the Kafka configuration for brokers.
func kafkaConnectionFlags(fs *flag.FlagSet, getenv func(string) string) func(brokers []string) (KafkaConfig, error) {
	var cfg Config
	var conn []setting
	for _, s := range cfg.settings() {
		if strings.HasPrefix(s.name, "kafka-tls") || strings.HasPrefix(s.name, "kafka-sasl") || s.name == "kafka-compression" {
			conn = append(conn, s)
		}
	}
	vals := map[string]*string{}
	bools := map[string]*bool{}
	for _, s := range conn {
		if s.bool {
			bools[s.name] = fs.Bool(s.name, false, s.usage+" (env "+s.env()+")")
		} else {
			vals[s.name] = fs.String(s.name, "", s.usage+" (env "+s.env()+")")
		}
	}
	return func(brokers []string) (KafkaConfig, error) {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for _, s := range conn {
			if v := getenv(s.env()); v != "" {
				if err := s.set(v); err != nil {
					return KafkaConfig{}, fmt.Errorf("%s: %w", s.env(), err)
				}
			}
			if !set[s.name] {
				continue
			}
			v := ""
			if s.bool {
				v = strconv.FormatBool(*bools[s.name])
			} else {
				v = *vals[s.name]
			}
			if err := s.set(v); err != nil {
				return KafkaConfig{}, fmt.Errorf("--%s: %w", s.name, err)
			}
		}
		if _, err := compressionCodec(cfg.Kafka.Compression); err != nil {
			return KafkaConfig{}, fmt.Errorf("--kafka-compression: %w", err)
		}
		cfg.Kafka.Brokers = brokers
		return cfg.Kafka, nil
	}
}
