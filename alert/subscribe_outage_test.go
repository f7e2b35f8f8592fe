package alert

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/sink"
)

// outage is a dialer whose connections can all be cut and refused, as a restarting broker does
// to every client at once.
type outage struct {
	down  atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
}

func (o *outage) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if o.down.Load() {
		return nil, &net.OpError{Op: "dial", Net: network, Err: errRefused}
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		o.mu.Lock()
		o.conns = append(o.conns, c)
		o.mu.Unlock()
	}
	return c, err
}

// cut closes every connection made so far and refuses new ones until restore.
func (o *outage) cut() {
	o.down.Store(true)
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range o.conns {
		c.Close()
	}
	o.conns = nil
}

func (o *outage) restore() { o.down.Store(false) }

type refused struct{}

func (refused) Error() string { return "connection refused" }

var errRefused = refused{}

// subscriberTopic creates a topic of parts partitions on the test broker and returns an admin
// client and a function that publishes n snapshots (corrections named from first on) to partition p.
func subscriberTopic(t *testing.T, parts int) (string, *kafka.Client, func(p, first, n int)) {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	ctx := context.Background()
	topic := testenv.Name(t, "alert-outage")
	admin := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second, Transport: &kafka.Transport{}}
	if _, err := admin.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: topic, NumPartitions: parts, ReplicationFactor: 1}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}}) })
	publish := func(p, first, n int) {
		t.Helper()
		w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: &kafka.Transport{},
			Balancer: kafka.BalancerFunc(func(kafka.Message, ...int) int { return p })}
		defer w.Close()
		var msgs []kafka.Message
		for i := first; i < first+n; i++ {
			s := snap("live", 1, [2]int64{1, 10}, [2]int64{1, 10}, t0)
			s.Aggregate.CorrectionID = "fix-" + strconv.Itoa(i)
			o := sink.SnapshotOut(s)
			m, err := sink.Record(&o, t0)
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, m)
		}
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; {
			// A new topic or partition may take a moment to have a leader.
			if err = w.WriteMessages(ctx, msgs...); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return topic, admin, publish
}

// collect reads updates until want distinct corrections were seen or the deadline passes, and
// returns the corrections seen.
func collect(t *testing.T, out <-chan Update, seen map[string]bool, want int, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for len(seen) < want {
		select {
		case u := <-out:
			if u.Snapshot != nil {
				seen[u.Snapshot.Aggregate.CorrectionID] = true
			}
		case <-deadline:
			t.Fatalf("%d of %d snapshots within %s", len(seen), want, within)
		}
	}
}

// A broker that goes away and comes back (every connection cut, dials refused meanwhile) does not
// end the subscriber, whose Run inside `run` shares the processor's errgroup: it retries, says so
// in Degraded, and resumes after the last snapshot it handed on, so the snapshots published during
// the outage arrive and none is handed on twice. A quiet partition (nothing published meanwhile)
// is no longer degraded once its leader answers again.
func TestSubscriberOutlivesBrokerOutage(t *testing.T) {
	for _, during := range []int{2, 0} {
		t.Run(fmt.Sprintf("%d published during the outage", during), func(t *testing.T) {
			topic, _, publish := subscriberTopic(t, 1)
			brokers := testenv.KafkaBrokers(t)
			publish(0, 0, 3)
			o := &outage{}
			d := &kafka.Dialer{Timeout: 2 * time.Second, DialFunc: o.dial}
			sub := &Subscriber{Brokers: brokers, Dialer: d, Log: zap.NewNop(), Topics: []string{topic},
				Partitions: func(context.Context, string) ([]int, error) { return []int{0}, nil }}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			out := make(chan Update, 64)
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx, out) }()
			seen := map[string]bool{}
			collect(t, out, seen, 3, time.Minute)

			o.cut()
			for deadline := time.Now().Add(time.Minute); len(sub.Degraded()) == 0; time.Sleep(50 * time.Millisecond) {
				select {
				case err := <-done:
					t.Fatalf("Run ended during the outage: %v", err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("the subscriber did not notice the outage within a minute")
				}
			}
			if during > 0 {
				publish(0, 3, during) // while the subscriber cannot reach the broker
			}
			o.restore()
			collect(t, out, seen, 3+during, time.Minute)
			for deadline := time.Now().Add(time.Minute); len(sub.Degraded()) > 0; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("still degraded a minute after the broker came back: %q", sub.Degraded())
				}
			}
			select {
			case u := <-out:
				if u.Snapshot != nil {
					t.Fatalf("snapshot %s handed on twice after the outage", u.Snapshot.Aggregate.CorrectionID)
				}
			default:
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run = %v once its context ended, want nil", err)
			}
		})
	}
}

// Partitions added to a topic while the subscriber runs are read too, from their first offset:
// an evaluator that kept only the partitions of its start never sees the aggregates hashed to the
// new ones, and beside an evaluator started later the two disagree about what exists.
func TestSubscriberReadsPartitionsAddedWhileRunning(t *testing.T) {
	topic, admin, publish := subscriberTopic(t, 1)
	brokers := testenv.KafkaBrokers(t)
	publish(0, 0, 2)
	d := &kafka.Dialer{Timeout: 5 * time.Second}
	sub := &Subscriber{Brokers: brokers, Dialer: d, Log: zap.NewNop(), Topics: []string{topic}, RescanEvery: 200 * time.Millisecond,
		Partitions: func(ctx context.Context, topic string) ([]int, error) {
			ps, err := d.LookupPartitions(ctx, "tcp", brokers[0], topic)
			var out []int
			for _, p := range ps {
				out = append(out, p.ID)
			}
			return out, err
		}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := make(chan Update, 64)
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx, out) }()
	seen := map[string]bool{}
	collect(t, out, seen, 2, time.Minute)
	if _, err := admin.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{Topics: []kafka.TopicPartitionsConfig{
		{Name: topic, Count: 3}}}); err != nil {
		t.Fatal(err)
	}
	publish(2, 2, 3)
	collect(t, out, seen, 5, time.Minute)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A topic that does not exist yet is no failure: once Kafka answers again (saying the topic is
// not there), a metadata failure in between no longer makes the subscriber degraded.
func TestSubscriberNotDegradedByAMissingTopic(t *testing.T) {
	var calls atomic.Int64
	s := &Subscriber{Topics: []string{"alerts"}, RescanEvery: 10 * time.Millisecond, Log: zap.NewNop(),
		Partitions: func(context.Context, string) ([]int, error) {
			if calls.Add(1) == 3 {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errRefused}
			}
			return nil, kafka.UnknownTopicOrPartition
		}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan Update, 10)
	done := make(chan struct{})
	go func() { s.Run(ctx, out); close(done) }()
	for deadline := time.Now().Add(time.Minute); calls.Load() < 6; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no rescans within a minute")
		}
	}
	d := s.Degraded()
	cancel()
	<-done
	if len(d) != 0 {
		t.Fatalf("Kafka answers again (the topic is not there yet) but Degraded says %q", d)
	}
}
