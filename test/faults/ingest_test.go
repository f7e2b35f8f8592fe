package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/ingest"
	"github.com/repeatrate/repeatrate/internal/auth"
)

// Scenario 8: the Kafka broker freezes (SIGSTOP) while 4 clients post 1 800-event batches (about
// 0.9 MB each) to /v1/events, past a 4 MiB in-flight budget. The Kafka writes in flight never hold
// more than the budget (the ingest's own gauge), the processor's memory stays within the budget
// plus 100 MB, no event is answered "failed" that Kafka may yet write, past the budget requests are
// refused up front, and once the broker resumes every accepted event is on the topic and none
// answered failed or not_written is.
//
// The input topic starts empty, so that the memory measured is the ingest's: a processor still
// consuming an input grows by its own batches and caches meanwhile, by more or less as the freeze
// finds it, and once done it holds a heap with room enough to hide the ingest's growth.
func TestIngestWhileBrokerFrozen(t *testing.T) {
	needScripts(t, "kafka.sh")
	s := newEmptyScenario(t)
	const budget = 4 << 20
	addr := freeAddr(t)
	token := "rr_fault_ingest_token_0123456789"
	p := s.startEnv([]string{"REPEATRATE_HTTP_TOKENS=ingest:" + auth.Hash(token) + ":*=read-write"},
		"run", "--http-addr="+addr, fmt.Sprintf("--http-ingest-max-inflight-bytes=%d", budget), "--http-rate-limit=10000",
		"--http-ingest-workspace-rate=100000000") // the in-flight budget is under test, not the quota
	base := "http://" + addr
	waitReady(t, base, 2*time.Minute)

	before := rss(t, p.Pid())
	resume := freezeBroker(t, s)

	// The ingest's own count of the bytes its Kafka writes hold: a write holds its bytes for
	// seconds with the broker frozen, so a sample a second finds it.
	peaks := watchPeaks(t, p.Pid(), base, "repeatrate_ingest_inflight_bytes", before)
	var mu sync.Mutex
	answered := map[string]string{} // event id → status
	client := &http.Client{Timeout: time.Minute}
	deadline := time.Now().Add(25 * time.Second)
	var clients sync.WaitGroup
	for c := range 4 {
		clients.Go(func() {
			for r := 0; r < 50 && time.Now().Before(deadline); r++ {
				ids, body := ingestBatch(c, r, 1800)
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/events", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/cloudevents-batch+json")
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				var ans ingest.Answer
				json.NewDecoder(resp.Body).Decode(&ans)
				resp.Body.Close()
				mu.Lock()
				for i, e := range ans.Events {
					answered[ids[i]] = e.Status
				}
				mu.Unlock()
				if len(ans.Events) != len(ids) {
					t.Errorf("client %d: %d answered %d results for %d events", c, resp.StatusCode, len(ans.Events), len(ids))
					return
				}
				if resp.StatusCode == http.StatusServiceUnavailable {
					wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
					time.Sleep(min(time.Duration(wait)*time.Second, time.Until(deadline)))
				}
			}
		})
	}
	clients.Wait()
	peak, peakInFlight := peaks()
	statuses := map[string]int{}
	for _, st := range answered {
		statuses[st]++
	}
	t.Logf("broker frozen 25 s: answers %v, RSS %d MB before, %d MB at most; Kafka writes held %.1f MB at most",
		statuses, before>>20, peak>>20, peakInFlight/(1<<20))
	// The budget itself, exactly, by the ingest's own gauge; the process's memory more coarsely:
	// it also holds the requests being read and judged, and the collector's headroom over them.
	if peakInFlight <= 0 || peakInFlight > budget {
		t.Errorf("the Kafka writes in flight held at most %.0f bytes, want some and at most the %d budget", peakInFlight, budget)
	}
	if peak-before > budget+100<<20 {
		t.Errorf("RSS grew by %d MB with the broker frozen, want at most the %d MB budget + 100 MB", (peak-before)>>20, budget>>20)
	}
	if statuses[ingest.StatusFailed] != 0 {
		t.Errorf("%d events answered failed while the broker was frozen: Kafka may yet write them", statuses[ingest.StatusFailed])
	}
	if statuses[ingest.StatusUnknown] == 0 || statuses[ingest.StatusNotWritten] == 0 {
		t.Fatalf("answers %v: the scenario reached neither the write timeout nor the budget", statuses)
	}

	resume()
	waitReady(t, base, 5*time.Minute) // every write in flight finished
	onTopic := idsOnTopic(t, s.brokers, s.topic("in"))
	lost, extra := 0, 0
	for id, st := range answered {
		switch {
		case st == ingest.StatusAccepted && !onTopic[id]:
			lost++
		case (st == ingest.StatusFailed || st == ingest.StatusNotWritten) && onTopic[id]:
			extra++
		}
	}
	if lost > 0 || extra > 0 {
		t.Fatalf("%d accepted events missing from the topic, %d answered failed or not_written written anyway", lost, extra)
	}
	unknownWritten := 0
	for id, st := range answered {
		if st == ingest.StatusUnknown && onTopic[id] {
			unknownWritten++
		}
	}
	t.Logf("after the broker resumed: %d of %d events answered unknown were written", unknownWritten, statuses[ingest.StatusUnknown])
}

// metricSum is the sum of every series of the metric name that base's /metrics serves whose
// labels hold every one of labels (each as `key="value"`); 0 when it cannot be read.
func metricSum(base, name string, labels ...string) float64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var sum float64
	for sc.Scan() {
		series, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(series, "#") {
			continue
		}
		n, ls, _ := strings.Cut(series, "{")
		if n != name || !holdsAll(ls, labels) {
			continue
		}
		f, _ := strconv.ParseFloat(value, 64)
		sum += f
	}
	return sum
}

// holdsAll says whether a series' labels (`a="x",b="y"}`, none of whose values holds a comma)
// hold every one of want, each a whole `key="value"` pair.
func holdsAll(labels string, want []string) bool {
	pairs := strings.Split(strings.TrimSuffix(labels, "}"), ",")
	for _, w := range want {
		if !slices.Contains(pairs, w) {
			return false
		}
	}
	return true
}

// freezeBroker stops the scenario's broker (SIGSTOP: its connections stay open and every request
// hangs) and returns what resumes it, which also runs when the test ends: the broker is shared.
func freezeBroker(t *testing.T, s *scenario) (resume func()) {
	t.Helper()
	_, port, _ := net.SplitHostPort(s.brokers[0])
	b, err := os.ReadFile(filepath.Join(repoRoot, ".cache/kafka/node-"+port, "kafka.pid"))
	if err != nil {
		t.Fatalf("the broker's pid: %v", err)
	}
	broker, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { syscall.Kill(broker, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	if err := syscall.Kill(broker, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	return resume
}

// watchPeaks samples process pid's RSS every 100 ms, and the metric name from base's /metrics
// once a second (a scrape renders every metric: garbage the RSS would count), until the returned
// stop is called; stop returns the highest RSS, from at least, and the highest value of the metric.
func watchPeaks(t *testing.T, pid int, base, name string, from int64) (stop func() (rss int64, metric float64)) {
	var mu sync.Mutex
	peak, peakMetric := from, 0.0
	done := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for tick := 1; ; tick++ {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			r, m := rss(t, pid), 0.0
			if tick%10 == 0 {
				m = metricSum(base, name)
			}
			mu.Lock()
			peak, peakMetric = max(peak, r), max(peakMetric, m)
			mu.Unlock()
		}
	})
	return func() (int64, float64) {
		close(done)
		sampler.Wait()
		return peak, peakMetric
	}
}

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitReady waits until base's /readyz answers 200.
func waitReady(t *testing.T, base string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/readyz not ready within %s (last: %v)", base, within, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rss is the resident memory of process pid in bytes (0 when it cannot be read).
func rss(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// ingestBatch is a batch of n live attempts of client c's request r, with their ids.
func ingestBatch(c, r, n int) ([]string, []byte) {
	now := time.Now().UTC().Format(time.RFC3339)
	ids := make([]string, n)
	evs := make([]map[string]any, n)
	for i := range n {
		ids[i] = fmt.Sprintf("ing-%d-%d-%d", c, r, i)
		evs[i] = map[string]any{"specversion": "1.0", "id": ids[i], "source": "fault/ingest", "type": "repeatrate.live.attempt.v1",
			"datacontenttype": "application/json",
			"data": map[string]any{"scope": map[string]string{"workspace": "acme", "model": "m", "run": "r", "checkpoint": "c", "artifact": "prod"},
				"opportunity_id": ids[i], "correction_id": "fix", "occurred_at": now, "assessed_at": now, "outcome": "passed"}}
	}
	b, _ := json.Marshal(evs)
	return ids, b
}

// idsOnTopic reads topic's partitions up to their end and returns the ids of the ingest's events.
func idsOnTopic(t *testing.T, brokers []string, topic string) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second, Transport: &kafka.Transport{}}
	// A broker just thawed may answer "not leader" for a partition until it has its leadership
	// back: ask again until every partition answers, or the deadline.
	var res *kafka.ListOffsetsResponse
	for {
		var err error
		res, err = client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{
			topic: {kafka.LastOffsetOf(0), kafka.LastOffsetOf(1), kafka.LastOffsetOf(2), kafka.LastOffsetOf(3)}}})
		if err == nil {
			for _, po := range res.Topics[topic] {
				if po.Error != nil {
					err = po.Error
				}
			}
		}
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("list the offsets of %s: %v", topic, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	out := map[string]bool{}
	for _, po := range res.Topics[topic] {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: po.Partition, MaxBytes: 16 << 20})
		for next := int64(0); next < po.LastOffset; {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("read %s/%d at %d of %d: %v", topic, po.Partition, next, po.LastOffset, err)
			}
			next = m.Offset + 1
			if !bytes.Contains(m.Value, []byte(`"fault/ingest"`)) {
				continue
			}
			var ev struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(m.Value, &ev) == nil {
				out[ev.ID] = true
			}
		}
		r.Close()
	}
	return out
}
