package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ReadToken is the bearer token of the busy readers; ReadSideArgs grants it read permission.
const ReadToken = "rr-test-busy-reader-0123456789"

// ReadSideArgs returns the flags of `run` that serve the read side on a free local port for
// ReadToken in workspaces, with a rate limit the readers do not reach, and the address.
func ReadSideArgs(workspaces []string) (args []string, addr string, err error) {
	if addr, err = freshReadSideAddr(); err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256([]byte(ReadToken))
	grants := make([]string, len(workspaces))
	for i, w := range workspaces {
		grants[i] = w + "=read"
	}
	return []string{"--http-addr=" + addr, "--http-tokens=busy:" + hex.EncodeToString(sum[:]) + ":" + strings.Join(grants, ","),
		// The readers are to keep the suite store busy, not to be refused by the limits that
		// protect it from one token.
		"--http-rate-limit=100000", "--http-read-budget=100000000", "--http-max-reads-in-flight=1000"}, addr, nil
}

// handedOut holds the addresses ReadSideArgs gave: a port closed after Listen(":0") can be given
// again by the next Listen, and two processors of one scenario told the same port fail to start.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// freshReadSideAddr returns a free local address that this process has not handed out before.
func freshReadSideAddr() (string, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := l.Addr().String()
		l.Close()
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr, nil
		}
	}
	return "", fmt.Errorf("no local port this process has not handed out in 100 tries")
}

// SuiteRef names a suite the busy readers read.
type SuiteRef struct{ Workspace, Suite string }

// Readers keep the read side of processors busy beside their batches, as dashboards do: each
// loops over the processors' addresses and the suites, reading the suite page, the suite API
// (discrimination, stability) and an SSE catch-up (/v1/stream?suite=…, read for a moment). The
// suite reads go through the same suite store as the processor's batches.
type Readers struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// Requests and SuiteAnswers count what was sent and the suite API's 200 answers.
	Requests, SuiteAnswers atomic.Int64
}

// StartReaders starts n readers on the processors addrs returns (asked again each round: the
// scenario starts and kills processors) and the suites. Stop ends them.
func StartReaders(n int, addrs func() []string, suites []SuiteRef) *Readers {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Readers{cancel: cancel}
	client := &http.Client{Timeout: 5 * time.Second}
	for i := range n {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for round := i; ctx.Err() == nil; round++ {
				as := addrs()
				if len(as) == 0 || len(suites) == 0 {
					sleep(ctx, 100*time.Millisecond)
					continue
				}
				addr, s := as[round%len(as)], suites[round%len(suites)]
				q := url.Values{"workspace": {s.Workspace}, "suite": {s.Suite}}.Encode()
				for _, path := range []string{"/v1/suites/discrimination", "/v1/suites/stability", "/ui/suite"} {
					if code := r.get(ctx, client, "http://"+addr+path+"?"+q, 0); code == http.StatusOK && strings.HasPrefix(path, "/v1/") {
						r.SuiteAnswers.Add(1)
					}
				}
				r.get(ctx, client, "http://"+addr+"/v1/stream?"+q+"&last_event_id=0", 200*time.Millisecond)
				sleep(ctx, 10*time.Millisecond)
			}
		}()
	}
	return r
}

// get sends one request and reads the answer, for at most within when not zero (a stream).
func (r *Readers) get(ctx context.Context, client *http.Client, u string, within time.Duration) int {
	if within > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, within)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+ReadToken)
	r.Requests.Add(1)
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// Stop ends the readers and waits for them.
func (r *Readers) Stop() {
	r.cancel()
	r.wg.Wait()
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// Workspaces returns the names ws-0 … ws-(n-1), as the synthetic generator names them.
func Workspaces(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "ws-" + strconv.Itoa(i)
	}
	return out
}

// Check fails t with Problem's answer, or logs what the readers did.
func (r *Readers) Check(t testing.TB, procs []*Proc, mayLoseWrites bool) {
	t.Helper()
	if err := r.Problem(procs, mayLoseWrites); err != nil {
		t.Fatal(err)
	}
	t.Logf("read side busy: %d requests, %d suite answers", r.Requests.Load(), r.SuiteAnswers.Load())
}

// Problem says why the scenario beside the readers failed: they got no suite answer (the read
// side was not exercised), or, unless mayLoseWrites (the scenario makes Redis lose acknowledged
// writes on purpose), a processor's log says it found writes lost: a rewind without a loss is a
// failure. Nil when neither.
func (r *Readers) Problem(procs []*Proc, mayLoseWrites bool) error {
	if n := r.SuiteAnswers.Load(); n == 0 {
		return fmt.Errorf("the busy readers got no suite answer in %d requests: the read side was not exercised", r.Requests.Load())
	}
	if !mayLoseWrites {
		for _, p := range procs {
			out := string(p.Output())
			for _, loss := range []string{"redis lost acknowledged writes", "committed work was lost"} {
				if strings.Contains(out, loss) {
					return fmt.Errorf("%s found writes lost although Redis lost none (%q), the read side busy beside it:\n%s", p.Name, loss, p.Tail(20))
				}
			}
		}
	}
	return nil
}
