package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/sink"
)

func tlsConfig(c TLSConfig) (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls ca file %s holds no PEM certificate", c.CAFile)
		}
		cfg.RootCAs = pool
	}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func saslMechanism(c SASLConfig) (sasl.Mechanism, error) {
	switch strings.ToLower(c.Mechanism) {
	case "":
		return nil, nil
	case "plain":
		return plain.Mechanism{Username: c.Username, Password: c.Password}, nil
	case "scram-sha-256":
		return scram.Mechanism(scram.SHA256, c.Username, c.Password)
	case "scram-sha-512":
		return scram.Mechanism(scram.SHA512, c.Username, c.Password)
	}
	return nil, fmt.Errorf("unknown sasl mechanism %q", c.Mechanism)
}

// kafkaClients holds what every Kafka connection of the process shares.
type kafkaClients struct {
	brokers   []string
	dialer    *kafka.Dialer
	transport *kafka.Transport
	// limits holds the max.message.bytes of the topics checkOutputLimits read; other topics are
	// taken to have Kafka's default.
	limits map[string]int
	// mechanism is the SASL mechanism configured ("" for none), for error messages.
	mechanism string
	// compression is the codec of the writers' record batches.
	compression kafka.Compression
}

func newKafkaClients(c KafkaConfig) (*kafkaClients, error) {
	t, err := tlsConfig(c.TLS)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	mech, err := saslMechanism(c.SASL)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	codec, err := compressionCodec(c.Compression)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	return &kafkaClients{
		compression: codec,
		brokers:     c.Brokers,
		dialer:      &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true, TLS: t, SASLMechanism: mech},
		transport:   &kafka.Transport{TLS: t, SASL: mech, DialTimeout: 10 * time.Second},
		mechanism:   c.SASL.Mechanism,
	}, nil
}

// writer returns a synchronous, fully acknowledged writer: WriteMessages returns once every replica
// has the batch. Murmur2 places keys where Java clients would. Its batches never exceed the
// topic's max.message.bytes (the broker refuses a larger record batch, and the publish would be
// retried forever): see batchBytes.
func (k *kafkaClients) writer(topic string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(k.brokers...),
		Topic:        topic,
		Balancer:     &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		// kafka-go gives every new batch a slice of BatchSize messages up front (about 160 bytes
		// each, zeroed), per partition and publish: 5 000 cost 7 % of the processor's CPU in
		// clearing memory. A publish of more messages to one partition goes out in several
		// batches, still in one WriteMessages call.
		BatchSize:    1000,
		BatchBytes:   k.batchBytes(topic),
		BatchTimeout: 2 * time.Millisecond,
		WriteTimeout: 30 * time.Second,
		Transport:    k.transport,
		Compression:  k.compression,
	}
}

// compressionCodec is the codec named by kafka.compression ("" and "none": no compression).
func compressionCodec(name string) (kafka.Compression, error) {
	switch name {
	case "", "none":
		return 0, nil
	case "gzip":
		return kafka.Gzip, nil
	case "snappy":
		return kafka.Snappy, nil
	case "lz4":
		return kafka.Lz4, nil
	case "zstd":
		return kafka.Zstd, nil
	}
	return 0, fmt.Errorf("unknown codec %q (none, gzip, snappy, lz4 or zstd)", name)
}

// maxBatchBytes caps a writer's batches even on a topic that accepts more: one produce request
// stays well under the broker's socket.request.max.bytes.
const maxBatchBytes = 16 << 20

// batchBytes is the BatchBytes of a writer to topic: its max.message.bytes (as checkOutputLimits
// read it, else Kafka's default) less the record batch overhead, and less compression's overhead
// when the writers compress, at most maxBatchBytes. Every record limit of the process (the ingest's,
// the dead letters' cut) is a writer's BatchBytes, so each accepted record fits a batch.
func (k *kafkaClients) batchBytes(topic string) int64 {
	limit, ok := k.limits[topic]
	if !ok {
		limit = sink.DefaultTopicLimit
	}
	if k.compression != 0 {
		return min(sink.CompressedWriterBatchBytes(limit), maxBatchBytes)
	}
	return min(sink.WriterBatchBytes(limit), maxBatchBytes)
}

// topicLimits returns the max.message.bytes of each topic that the broker tells; topics it says
// nothing about (an error, an old or minimal broker) are absent from the map.
func (k *kafkaClients) topicLimits(ctx context.Context, topics []string) (map[string]int, error) {
	req := &kafka.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"max.message.bytes"}})
	}
	resp, err := k.client().DescribeConfigs(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("describe topic configs: %w", err)
	}
	out := map[string]int{}
	for _, r := range resp.Resources {
		if r.Error != nil {
			continue
		}
		for _, e := range r.ConfigEntries {
			if n, err := strconv.Atoi(e.ConfigValue); e.ConfigName == "max.message.bytes" && err == nil {
				out[r.ResourceName] = n
			}
		}
	}
	return out, nil
}

// checkOutputLimits reads the output topics' max.message.bytes where the broker tells it and
// sizes the writers' batches by it. It fails when a topic accepts less than sink.MinTopicLimit:
// the limits on input (schemas.MaxIdentityBytes and the rest) guarantee outputs of at most
// sink.MaxRecordBytes, and a smaller topic would refuse some of them, blocking their partition.
// A topic whose limit the broker does not tell is taken to have Kafka's default, which is enough,
// and logged.
func (k *kafkaClients) checkOutputLimits(ctx context.Context, topics []string, log *zap.Logger) error {
	limits, err := k.topicLimits(ctx, topics)
	if err != nil {
		log.Warn("cannot read the output topics' max.message.bytes; assuming Kafka's default", zap.Error(err),
			zap.Int("assumed", sink.DefaultTopicLimit))
		limits = map[string]int{}
	}
	need, why := sink.MinTopicLimit, ""
	if k.compression != 0 {
		need, why = sink.MinCompressedTopicLimit, ", compressed"
	}
	var errs []error
	for _, t := range topics {
		n, ok := limits[t]
		switch {
		case !ok:
			log.Warn("the broker does not tell the topic's max.message.bytes; assuming Kafka's default", zap.String("topic", t),
				zap.Int("assumed", sink.DefaultTopicLimit))
		case n < need:
			errs = append(errs, fmt.Errorf("topic %s accepts records of at most %d bytes (max.message.bytes); repeatrate's outputs%s need %d: raise it",
				t, n, why, need))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	k.limits = limits
	return nil
}

// topicSpec is a topic to create when missing.
type topicSpec struct {
	name       string
	partitions int
	compacted  bool
}

// checkConnection asks the brokers for metadata once, so that a connection that cannot work fails
// with its cause (explainKafka): kafka-go reports a failed TLS or SASL handshake only to metadata
// requests, and a CreateTopics sent after one fails with "[8] Broker Not Available".
func (k *kafkaClients) checkConnection(ctx context.Context) error {
	if _, err := k.client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}}); err != nil {
		return explainKafka(k.brokers, k.mechanism, err)
	}
	return nil
}

// explainKafka names the likely cause of a failure to talk to the brokers beside kafka-go's error:
// authentication, mechanism, certificate, or TLS on one side only.
func explainKafka(brokers []string, mechanism string, err error) error {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var hint string
	switch msg := err.Error(); {
	case errors.Is(err, kafka.SASLAuthenticationFailed):
		hint = "authentication failed: wrong kafka.sasl.username or password (or the user does not exist for this mechanism)"
	case errors.Is(err, kafka.UnsupportedSASLMechanism), errors.Is(err, kafka.IllegalSASLState):
		hint = fmt.Sprintf("the brokers do not accept SASL mechanism %q: check kafka.sasl.mechanism", mechanism)
	case errors.As(err, &unknownCA):
		hint = "the brokers' certificate is not signed by a trusted CA: set kafka.tls.ca_file (--kafka-tls-ca-file) to their CA"
	case errors.As(err, &hostname):
		hint = "the brokers' certificate does not carry the name checked (the host dialled, or kafka.tls.server_name)"
	case strings.Contains(msg, "expecting TLS"):
		hint = "the brokers expect TLS: set kafka.tls.enabled (--kafka-tls)"
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		hint = "the brokers do not speak TLS on this port: unset kafka.tls.enabled or use their TLS listener"
	case mechanism == "" && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)):
		hint = "the brokers closed the connection: does the listener expect SASL (kafka.sasl.mechanism)?"
	default:
		return fmt.Errorf("kafka %v: %w", brokers, err)
	}
	return fmt.Errorf("kafka %v: %s: %w", brokers, hint, err)
}

// explainRedis names the likely cause of a failure to talk to Redis beside go-redis's error.
func explainRedis(c RedisConfig, err error) error {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var hint string
	switch msg := err.Error(); {
	case strings.HasPrefix(msg, "WRONGPASS"), strings.Contains(msg, "invalid password"):
		hint = "authentication failed: wrong redis.username or redis.password"
	case strings.HasPrefix(msg, "NOAUTH"):
		hint = "Redis requires a password: set redis.password (and redis.username for an ACL user)"
	case strings.HasPrefix(msg, "NOPERM"):
		hint = "the ACL user lacks a permission the processor needs (README, Security)"
	case errors.As(err, &unknownCA):
		hint = "the server's certificate is not signed by a trusted CA: set redis.tls.ca_file (--redis-tls-ca-file) to its CA"
	case errors.As(err, &hostname):
		hint = "the server's certificate does not carry the name checked (the host dialled, or redis.tls.server_name)"
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		hint = "the server does not speak TLS on this port: unset redis.tls.enabled or use its tls-port"
	case !c.TLS.Enabled && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)):
		hint = "the server closed the connection: does it expect TLS (redis.tls.enabled, --redis-tls)?"
	default:
		return fmt.Errorf("redis %v: %w", c.Addrs, err)
	}
	return fmt.Errorf("redis %v: %s: %w", c.Addrs, hint, err)
}

// ensureTopics creates the topics that do not exist yet; existing ones are left as they are.
func (k *kafkaClients) ensureTopics(ctx context.Context, specs []topicSpec) error {
	if err := k.checkConnection(ctx); err != nil {
		return err
	}
	client := &kafka.Client{Addr: kafka.TCP(k.brokers...), Transport: k.transport, Timeout: 30 * time.Second}
	req := &kafka.CreateTopicsRequest{}
	for _, s := range specs {
		tc := kafka.TopicConfig{Topic: s.name, NumPartitions: s.partitions, ReplicationFactor: -1}
		if s.compacted {
			tc.ConfigEntries = []kafka.ConfigEntry{{ConfigName: "cleanup.policy", ConfigValue: "compact"}}
		}
		req.Topics = append(req.Topics, tc)
	}
	resp, err := client.CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for name, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", name, err)
		}
	}
	return nil
}

// partitions lists the partitions of topic.
func (k *kafkaClients) partitions(ctx context.Context, topic string) ([]int, error) {
	client := &kafka.Client{Addr: kafka.TCP(k.brokers...), Transport: k.transport, Timeout: 30 * time.Second}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata %s: %w", topic, explainKafka(k.brokers, k.mechanism, err))
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return nil, fmt.Errorf("metadata %s: %w", topic, t.Error)
		}
		ps := make([]int, len(t.Partitions))
		for i, p := range t.Partitions {
			ps[i] = p.ID
		}
		return ps, nil
	}
	return nil, fmt.Errorf("topic %s: %w", topic, kafka.UnknownTopicOrPartition)
}

func newRedisClient(c RedisConfig) (redis.UniversalClient, error) {
	t, err := tlsConfig(c.TLS)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	opts := &redis.UniversalOptions{
		Addrs:     c.Addrs,
		Username:  c.Username,
		Password:  c.Password,
		DB:        c.DB,
		TLSConfig: t,
		// Never re-sent blind: a command the client re-sent after a read timeout had usually run
		// (a batch's pipeline slower than the timeout ran up to six times, its new opportunities
		// counted as duplicates, Redis doing the most work when it was most loaded). A failed
		// batch step is retried by the processor, counted (repeatrate_batch_retries_total).
		MaxRetries:  -1,
		DialTimeout: 5 * time.Second,
		// Sized to the work: a batch's pipeline may take seconds under load, bounded by the
		// batch's own deadline (the drain timeout) through ContextTimeoutEnabled; WAIT blocks up
		// to its timeout before it answers.
		ReadTimeout:           max(redisReadTimeout, c.WaitTimeout+2*time.Second),
		ContextTimeoutEnabled: true,
	}
	if len(c.Addrs) > 1 {
		co := opts.Cluster()
		// A pipeline to a dead primary does not make the client read the slot map again, only
		// this interval does: after a failover, batches fail until then.
		co.ClusterStateReloadInterval = clusterStateReload
		return redis.NewClusterClient(co), nil
	}
	return redis.NewUniversalClient(opts), nil
}

// redisReadTimeout bounds a Redis answer when the caller's context has no earlier deadline.
const redisReadTimeout = 30 * time.Second

// clusterStateReload is how often a Redis Cluster client reads the slot map (CLUSTER SLOTS): the
// longest a failover stalls the processor beyond the cluster's own detection (node timeout).
const clusterStateReload = 2 * time.Second

func hostPort(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	var port int
	_, err = fmt.Sscanf(p, "%d", &port)
	return h, port, err
}

func (k *kafkaClients) client() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(k.brokers...), Transport: k.transport, Timeout: 30 * time.Second}
}

// topicPartitions lists the partitions of every topic.
func (k *kafkaClients) topicPartitions(ctx context.Context, topics []string) (map[string][]int, error) {
	out := map[string][]int{}
	for _, t := range topics {
		ps, err := k.partitions(ctx, t)
		if err != nil {
			return nil, err
		}
		out[t] = ps
	}
	return out, nil
}

// committed returns the group's committed offsets of topics; partitions without one are absent.
// A group coordinator that is not there yet is waited for (awaitCoordinator), with a warning on
// log every coordinatorWarnEvery.
func (k *kafkaClients) committed(ctx context.Context, group string, topics []string, log *zap.Logger) (map[string]map[int]int64, error) {
	parts, err := k.topicPartitions(ctx, topics)
	if err != nil {
		return nil, err
	}
	resp, err := awaitCoordinator(ctx, log, group, coordinatorWarnEvery, func() (*kafka.OffsetFetchResponse, error) {
		resp, err := k.client().OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: parts})
		if err == nil && resp.Error != nil {
			err = resp.Error
		}
		return resp, err
	})
	if err != nil && !errors.Is(err, kafka.GroupIdNotFound) {
		return nil, fmt.Errorf("fetch offsets of group %s: %w", group, err)
	}
	if err != nil {
		return map[string]map[int]int64{}, nil // a group that never committed
	}
	out := map[string]map[int]int64{}
	for t, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return nil, fmt.Errorf("fetch offsets of group %s, %s/%d: %w", group, t, p.Partition, p.Error)
			}
			if p.CommittedOffset >= 0 {
				if out[t] == nil {
					out[t] = map[int]int64{}
				}
				out[t][p.Partition] = p.CommittedOffset
			}
		}
	}
	return out, nil
}

// coordinatorWarnEvery is how often awaitCoordinator warns while it waits.
const coordinatorWarnEvery = 10 * time.Second

// awaitCoordinator calls fetch until it answers, or fails otherwise than with a temporary Kafka
// error (a group coordinator moving, loading or not there yet: a new cluster makes its offsets
// topic first), backing off from 100 ms to 2 s. A cluster that cannot make its offsets topic
// (offsets.topic.replication.factor above its brokers) answers "coordinator not available" for
// ever, so while it waits it warns every warnEvery with the group, the time waited and the last
// error: a start held up there says why. ctx ends the wait with its error.
func awaitCoordinator(ctx context.Context, log *zap.Logger, group string, warnEvery time.Duration, fetch func() (*kafka.OffsetFetchResponse, error)) (*kafka.OffsetFetchResponse, error) {
	if log == nil {
		log = zap.NewNop()
	}
	start, warned := time.Now(), time.Duration(0)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		resp, err := fetch()
		if err == nil || errors.Is(err, kafka.GroupIdNotFound) || !consumer.Temporary(err) {
			return resp, err
		}
		if waited := time.Since(start); waited-warned >= warnEvery {
			warned = waited
			log.Warn("kafka: the consumer group's coordinator does not answer yet; waiting (a cluster whose offsets topic cannot be made, with offsets.topic.replication.factor above its brokers, never answers)",
				zap.String("group", group), zap.Duration("waited", waited.Round(time.Millisecond)), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// endOffsets returns the next offset to be written of every partition of topics. A partition
// whose leader is moving (just created, or a broker restarting) answers with a temporary error
// such as Not Leader For Partition: asked again for as long as the processor's reads wait out a
// moving leader (consumer.LeaderMoves), longer than kafka-go takes to learn the new leader.
func (k *kafkaClients) endOffsets(ctx context.Context, topics []string) (map[string]map[int]int64, error) {
	return consumer.RetryTemporary(ctx, consumer.LeaderMoves, consumer.LeaderWait, func() (map[string]map[int]int64, error) {
		return k.endOffsetsOnce(ctx, topics)
	})
}

func (k *kafkaClients) endOffsetsOnce(ctx context.Context, topics []string) (map[string]map[int]int64, error) {
	parts, err := k.topicPartitions(ctx, topics)
	if err != nil {
		return nil, err
	}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for t, ps := range parts {
		for _, p := range ps {
			req.Topics[t] = append(req.Topics[t], kafka.LastOffsetOf(p))
		}
	}
	resp, err := k.client().ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("list offsets: %w", err)
	}
	out := map[string]map[int]int64{}
	for t, ps := range resp.Topics {
		out[t] = map[int]int64{}
		for _, p := range ps {
			if p.Error != nil {
				return nil, fmt.Errorf("list offsets %s/%d: %w", t, p.Partition, p.Error)
			}
			out[t][p.Partition] = p.LastOffset
		}
	}
	return out, nil
}

// roundTrips counts Redis round trips: one per command sent alone, one per pipeline.
type roundTrips struct{ c prometheus.Counter }

func (h roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.c.Inc()
		return next(ctx, cmd)
	}
}

func (h roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.c.Inc()
		return next(ctx, cmds)
	}
}

// openClients builds the Kafka clients and the Redis client of a configuration.
func openClients(cfg Config) (*kafkaClients, redis.UniversalClient, error) {
	kc, err := newKafkaClients(cfg.Kafka)
	if err != nil {
		return nil, nil, err
	}
	rdb, err := newRedisClient(cfg.Redis)
	if err != nil {
		return nil, nil, err
	}
	return kc, rdb, nil
}
