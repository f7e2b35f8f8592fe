package readside

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/quota"
)

// httpMetrics are the read side's own metrics.
type httpMetrics struct {
	rejectedConns  prometheus.Counter
	openConns      prometheus.Gauge
	reclaimedConns prometheus.Counter
	limited        prometheus.Counter
	denied         *prometheus.CounterVec
	streams        prometheus.Gauge
	streamDrops    prometheus.Counter
	streamEvents   prometheus.Counter
	readCommands   prometheus.Counter
	readRefused    *prometheus.CounterVec
	held           prometheus.Counter
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		rejectedConns: prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_http_rejected_connections_total",
			Help: "Connections closed on accept: the server's or the client address's cap was reached."}),
		openConns: prometheus.NewGauge(prometheus.GaugeOpts{Name: "repeatrate_http_open_connections",
			Help: "Open HTTP connections."}),
		reclaimedConns: prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_http_reclaimed_connections_total",
			Help: "Keep-alive connections idle between requests closed to make room for a new one when a connection cap was reached."}),
		limited: prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_http_rate_limited_total",
			Help: "Requests answered 429: their token or client address exceeded the rate limit."}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "repeatrate_http_denied_total",
			Help: "Requests refused by authentication (401) or authorisation (403)."}, []string{"code"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "repeatrate_http_streams",
			Help: "Open event streams (/v1/stream)."}),
		streamDrops: prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_http_stream_drops_total",
			Help: "Event streams closed because the client read too slowly for its buffer."}),
		streamEvents: prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_http_stream_events_total",
			Help: "Events written to event streams."}),
		readCommands: prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_http_read_commands_total",
			Help: "Redis commands sent to serve read requests, each charged to its token's read budget."}),
		readRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "repeatrate_http_read_refused_total",
			Help: "Read requests answered 429 by limit: budget (the token's Redis commands per second were spent) or in_flight (the token already ran its most reads at once)."},
			[]string{"limit"}),
		held: prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_http_held_requests_total",
			Help: "Requests held until their token's (or client address's) Retry-After had passed: it was answered 429 and sent again sooner."}),
	}
	reg.MustRegister(m.rejectedConns, m.openConns, m.reclaimedConns, m.limited, m.denied, m.streams, m.streamDrops, m.streamEvents,
		m.readCommands, m.readRefused, m.held)
	return m
}

// limiter is a token bucket per key: "token <name>" for a configured token, else "addr <client
// address>". It keeps at most maxLimiterKeys address buckets; when full it forgets those that have
// refilled, which lose nothing. Token buckets are kept apart (one per configured token at most),
// so outsiders keeping address buckets busy never crowd a token out.
type limiter struct {
	mu      sync.Mutex
	rate    float64
	burst   float64
	now     func() time.Time
	buckets map[string]*bucket
	tokens  map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

const maxLimiterKeys = 10000

func newLimiter(rate float64, burst int, now func() time.Time) *limiter {
	return &limiter{rate: rate, burst: float64(burst), now: now, buckets: map[string]*bucket{}, tokens: map[string]*bucket{}}
}

// allow takes one request from key's bucket; when empty it returns how long until one refills.
func (l *limiter) allow(key string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if strings.HasPrefix(key, "token ") {
		b := l.tokens[key]
		if b == nil {
			b = &bucket{tokens: l.burst, at: now}
			l.tokens[key] = b
		}
		return l.take(b, now)
	}
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= maxLimiterKeys {
			for k, o := range l.buckets {
				if o.tokens+now.Sub(o.at).Seconds()*l.rate >= l.burst {
					delete(l.buckets, k)
				}
			}
			if len(l.buckets) >= maxLimiterKeys {
				// Every bucket is in use: an outsider cycling addresses. Refuse new keys.
				return false, time.Second
			}
		}
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[key] = b
	}
	return l.take(b, now)
}

// take takes one request from b at now.
func (l *limiter) take(b *bucket, now time.Time) (bool, time.Duration) {
	b.tokens = min(l.burst, b.tokens+now.Sub(b.at).Seconds()*l.rate)
	b.at = now
	if b.tokens < 1 {
		return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
	}
	b.tokens--
	return true, 0
}

// clientIP is the request's client address as the limits count it (addrKey). Forwarded headers
// are not trusted: behind a proxy every client shares the proxy's limit (README, Read side).
func clientIP(r *http.Request) string {
	return addrKey(r.RemoteAddr)
}

// addrKey is the client of a remote address ("host:port"): an IPv4 address, or the /64 of an IPv6
// one — a host is commonly given a whole /64, whose 2^64 addresses would each get their own
// limits.
func addrKey(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.WithZone("").Prefix(64)
	return p.String()
}

// capListener closes connections beyond max open ones, or beyond perIP from one address, as soon
// as they are accepted: an outsider opening thousands of slow connections holds at most perIP of
// them, each for at most the header timeout, and never exhausts the process's file descriptors.
// When a cap is reached, a keep-alive connection idle between requests is closed to make room
// (the longest idle first, of the same address when it is that address's cap): a slot held by a
// client that sent one request (a health probe, say) and then waits is taken back, so neither
// unauthenticated clients idling on every slot nor one address can lock the others out, probes
// included. A connection in the middle of a request is not chosen.
type capListener struct {
	net.Listener
	max, perIP int
	m          *httpMetrics
	mu         sync.Mutex
	open       int
	byIP       map[string]int
	conns      map[*capConn]struct{}
}

func newCapListener(l net.Listener, max, perIP int, m *httpMetrics) *capListener {
	return &capListener{Listener: l, max: max, perIP: perIP, m: m, byIP: map[string]int{}, conns: map[*capConn]struct{}{}}
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := addrKey(c.RemoteAddr().String())
		l.mu.Lock()
		ok := l.open < l.max && l.byIP[ip] < l.perIP
		var victim *capConn
		if !ok {
			victim = l.idleVictim(ip)
		}
		var cc *capConn
		if ok || victim != nil {
			// The victim's slot is given up when it closes, just below: counted here already.
			l.open++
			l.byIP[ip]++
			cc = &capConn{Conn: c, l: l, ip: ip}
			l.conns[cc] = struct{}{}
		}
		l.mu.Unlock()
		if cc == nil {
			l.m.rejectedConns.Inc()
			c.Close()
			continue
		}
		if victim != nil {
			l.m.reclaimedConns.Inc()
			victim.Close()
		}
		l.m.openConns.Inc()
		return cc, nil
	}
}

// idleVictim picks the connection to close for one from ip: the longest idle of ip's when ip is
// at its cap, else the longest idle of any. It marks it taken, so no other accept picks it. The
// caller holds mu.
func (l *capListener) idleVictim(ip string) *capConn {
	sameIP := l.byIP[ip] >= l.perIP
	var victim *capConn
	for c := range l.conns {
		if c.idleSince.IsZero() || (sameIP && c.ip != ip) {
			continue
		}
		if victim == nil || c.idleSince.Before(victim.idleSince) {
			victim = c
		}
	}
	if victim != nil {
		victim.idleSince = time.Time{}
	}
	return victim
}

// state follows the server's connection states (http.Server.ConnState): idle between requests
// or not.
func (l *capListener) state(c net.Conn, s http.ConnState) {
	cc, ok := c.(*capConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, open := l.conns[cc]; !open {
		return
	}
	if s == http.StateIdle {
		cc.idleSince = time.Now()
	} else {
		cc.idleSince = time.Time{}
	}
}

type capConn struct {
	net.Conn
	l    *capListener
	ip   string
	once sync.Once
	// idleSince is when the connection went idle between requests, zero while it is not idle
	// (new, in a request, or taken to be closed); guarded by l.mu.
	idleSince time.Time
}

// Read marks the connection busy as soon as bytes of a next request arrive: the server reports
// a request only once its whole header is read, and a connection whose header is on its way is
// no idle one to close for another.
func (c *capConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.l.mu.Lock()
		c.idleSince = time.Time{}
		c.l.mu.Unlock()
	}
	return n, err
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.open--
		if c.l.byIP[c.ip]--; c.l.byIP[c.ip] <= 0 {
			delete(c.l.byIP, c.ip)
		}
		c.l.mu.Unlock()
		c.l.m.openConns.Dec()
	})
	return err
}

// readMeter is carried in a read request's context: the Redis commands the request sends (counted
// by ReadCost, a hook on the Redis client) are charged to its key's read budget as they are sent.
type readMeter struct {
	budget *quota.Buckets
	key    string
	sent   prometheus.Counter
}

type readMeterKey struct{}

func withReadMeter(ctx context.Context, m *readMeter) context.Context {
	return context.WithValue(ctx, readMeterKey{}, m)
}

func (m *readMeter) charge(n int) {
	m.budget.Charge(m.key, float64(n))
	m.sent.Add(float64(n))
}

// ReadCost is a Redis client hook (redis.UniversalClient.AddHook) that charges each command a read
// request of the HTTP server sends, one per command, a pipeline's each, to the read budget of the
// request's token (HTTPConfig.ReadBudget). Commands sent outside a read request (the processor's,
// the catalog's recorder, the live feed) are not counted. Without it on the client the reads
// serve the read budget is never charged: only the request rate limits a token.
type ReadCost struct{}

var _ redis.Hook = ReadCost{}

// DialHook passes dials on.
func (ReadCost) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook charges one command.
func (ReadCost) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if m, ok := ctx.Value(readMeterKey{}).(*readMeter); ok {
			m.charge(1)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook charges each command of a pipeline.
func (ReadCost) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if m, ok := ctx.Value(readMeterKey{}).(*readMeter); ok {
			m.charge(len(cmds))
		}
		return next(ctx, cmds)
	}
}

// inFlight counts the requests each key runs at once, up to a cap.
type inFlight struct {
	max  int
	mu   sync.Mutex
	runs map[string]int
}

// enter takes a slot of key's, reporting false when key already runs max requests.
func (f *inFlight) enter(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.runs[key] >= f.max {
		return false
	}
	f.runs[key]++
	return true
}

// leave gives back a slot enter took.
func (f *inFlight) leave(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.runs[key]--; f.runs[key] <= 0 {
		delete(f.runs, key)
	}
}
