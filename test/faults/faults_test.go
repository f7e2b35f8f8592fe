package faults

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func sleepRandom(r *rand.Rand, lo, hi time.Duration) {
	time.Sleep(lo + time.Duration(r.Int64N(int64(hi-lo))))
}

// Scenario 1: SIGKILL the processor at random moments, restarting it each time.
func TestKillAndRestart(t *testing.T) {
	s := newScenario(t)
	r := rand.New(rand.NewPCG(1, 1))
	p := s.start()
	kills := 0
	for ; kills < 6; kills++ {
		sleepRandom(r, 500*time.Millisecond, 4*time.Second)
		p.Kill()
		p = s.start()
	}
	s.converge(5 * time.Minute)
	s.checkDeadLetters()
	t.Logf("%d events, %d poison, %d aggregates, %d SIGKILLs: exact", s.in.lines, sum(s.in.poison), len(s.in.expected), kills)
}

// Scenario 2: three instances join and leave; one is stopped past its session timeout and resumed.
func TestRebalanceAndZombie(t *testing.T) {
	s := newScenario(t)
	a := s.start()
	time.Sleep(1500 * time.Millisecond)
	b := s.start()
	c := s.start()
	time.Sleep(2 * time.Second)
	c.Signal(syscall.SIGSTOP) // a zombie: its generation ends while it is frozen
	b.Signal(syscall.SIGTERM) // one leaves cleanly
	if err, ok := b.Wait(30 * time.Second); !ok || err != nil {
		t.Fatalf("instance b did not leave cleanly: %v (exited %v)", err, ok)
	}
	time.Sleep(9 * time.Second) // past the 6 s session timeout
	c.Signal(syscall.SIGCONT)
	s.start() // and one joins
	time.Sleep(time.Second)
	a.Signal(syscall.SIGTERM)
	s.converge(5 * time.Minute)
	s.checkDeadLetters()
	t.Logf("%d events: 3 instances, one left, one zombie stopped 9s past a 6s session timeout, one joined: exact", s.in.lines)
}

// Scenario 3: the Kafka broker restarts mid-run, under two processors, one of them alerting:
// neither ends (the alert subscriber's reads of the snapshot topics fail too, and are retried).
func TestKafkaRestart(t *testing.T) {
	needScripts(t, "kafka.sh")
	s := newScenario(t)
	plain := s.start()
	alerting := s.startArgs("run", "--http-addr=", "--alert-rules="+filepath.Join(repoRoot, "deploy/alert-rules.example.yaml"))
	time.Sleep(2 * time.Second)
	service(t, "kafka.sh", "restart")
	s.converge(5 * time.Minute)
	s.checkDeadLetters()
	for _, p := range []*proc{plain, alerting} {
		if err, exited := p.Wait(0); exited {
			t.Fatalf("%s ended after the broker restart: %v\n%s", p.Name, err, p.Tail(10))
		}
	}
	t.Logf("%d events, broker restarted mid-run under two processors, one alerting: exact, both still running", s.in.lines)
}

// Scenario 4: Redis is SIGKILLed mid-run and restarts from its AOF (appendfsync everysec).
func TestRedisCrash(t *testing.T) {
	needScripts(t, "redis.sh")
	s := newScenario(t)
	s.mayLoseWrites = true // AOF everysec: a SIGKILL loses up to a second of writes
	s.start()
	for i := 0; i < 2; i++ {
		time.Sleep(2 * time.Second)
		service(t, "redis.sh", "crash")
		time.Sleep(time.Second)
		service(t, "redis.sh", "start")
	}
	s.converge(5 * time.Minute)
	s.checkDeadLetters()
	t.Logf("%d events, Redis SIGKILLed twice mid-run and recovered from AOF everysec: exact", s.in.lines)
}

// Scenario 5: Redis loses everything; the processor stops with a clear error; rebuild recovers.
func TestRedisStateLostAndRebuild(t *testing.T) {
	s := newScenario(t)
	s.mayLoseWrites = true
	p := s.start()
	// The restart below must find committed work gone: wait for a commit rather than a time that
	// a slow machine may not have committed within (it then rightly starts fresh).
	s.waitCommitted(2 * time.Minute)
	rdb := redis.NewClient(&redis.Options{Addr: s.redis})
	defer rdb.Close()
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	err, exited := p.Wait(2 * time.Minute)
	if !exited || err == nil {
		t.Fatalf("processor did not stop on lost state (exited %v, err %v)", exited, err)
	}
	if log := p.Tail(5); !strings.Contains(log, "redis state lost") || !strings.Contains(log, "rebuild") {
		t.Fatalf("the error does not say what happened and what to do:\n%s", log)
	}
	// Restarting without a rebuild refuses too.
	q := s.start()
	if err, exited := q.Wait(time.Minute); !exited || err == nil || !strings.Contains(q.Tail(3), "rebuild") {
		t.Fatalf("a restart on lost state must refuse (exited %v, err %v)", exited, err)
	}
	rebuild := s.run("rebuild")
	if err, _ := rebuild.Wait(5 * time.Minute); err != nil {
		t.Fatalf("rebuild: %v\n%s", err, rebuild.Tail(20))
	}
	s.start()
	s.converge(5 * time.Minute)
	s.checkDeadLetters()
	t.Logf("%d events, Redis flushed mid-run: detected, stopped, rebuilt from the input topic, cut over: exact", s.in.lines)
}

// Scenario 6: replies are lost after Redis ran the command; go-redis retries.
func TestLostReplies(t *testing.T) {
	s := newScenario(t)
	px := newDroppingProxy(t, s.redis, 0.02)
	s.redis = px.addr
	s.start()
	s.converge(5 * time.Minute)
	s.checkDeadLetters()
	if px.dropped.Load() < 5 {
		t.Fatalf("the proxy dropped only %d replies: the scenario did not test anything", px.dropped.Load())
	}
	t.Logf("%d events, %d Redis replies lost after execution: exact", s.in.lines, px.dropped.Load())
}

// Scenario 7: SIGTERM drains the batch in hand, commits, and exits 0 promptly.
func TestGracefulShutdown(t *testing.T) {
	s := newScenario(t)
	p := s.start()
	time.Sleep(3 * time.Second)
	began := time.Now()
	p.Signal(syscall.SIGTERM)
	err, exited := p.Wait(30 * time.Second)
	if !exited || err != nil {
		t.Fatalf("SIGTERM: exited %v, err %v\n%s", exited, err, p.Tail(20))
	}
	took := time.Since(began)
	if !strings.Contains(p.Tail(5), `"msg":"stopped"`) {
		t.Fatalf("no orderly stop in the log:\n%s", p.Tail(10))
	}
	s.start()
	s.converge(5 * time.Minute)
	s.checkDeadLetters()
	t.Logf("%d events, SIGTERM mid-run: exit 0 in %s, restart resumed: exact", s.in.lines, took.Round(time.Millisecond))
}

// run starts a one-off command of the binary with the scenario's configuration.
func (s *scenario) run(args ...string) *proc { return s.startArgs(args...) }

// droppingProxy forwards TCP to Redis and, with probability p per reply chunk, closes the
// connection instead of delivering the reply: the command ran, the client never hears.
type droppingProxy struct {
	addr    string
	dropped atomic.Int64
}

func newDroppingProxy(t *testing.T, target string, p float64) *droppingProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &droppingProxy{addr: l.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	r := rand.New(rand.NewPCG(6, 6))
	var mu sync.Mutex
	drop := func() bool { mu.Lock(); defer mu.Unlock(); return r.Float64() < p }
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(u, c); u.Close() }()
			go func() {
				defer c.Close()
				defer u.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := u.Read(buf)
					if n > 0 {
						if drop() {
							px.dropped.Add(1)
							return
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return px
}
