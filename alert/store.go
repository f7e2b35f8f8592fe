package alert

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/schemas"
)

// Notification is one message a sink delivers: an alert in a state, with a deterministic id so
// that a copy delivered twice (a sender that died between sending and acknowledging) is
// recognisable.
type Notification struct {
	ID    string        `json:"id"`
	Kind  string        `json:"kind"`
	At    time.Time     `json:"at"`
	Alert schemas.Alert `json:"alert"`
}

// notificationID names a notification by rule, subject, kind and firing episode (and, for a
// resend, its time).
func notificationID(rule, subject string, n Notify, firedAt, at time.Time) string {
	seed := rule + "\x00" + subject + "\x00" + n.String() + "\x00" + firedAt.UTC().Format(time.RFC3339Nano)
	if n == NotifyResend {
		seed += "\x00" + at.UTC().Format(time.RFC3339Nano)
	}
	sum := sha256.Sum256([]byte(seed))
	return hex.EncodeToString(sum[:16])
}

// Stored is a lifecycle record as Redis holds it, with its revision (0: absent).
type Stored struct {
	Record
	Rev     int64
	Rule    string
	Subject Subject
	// Episode is what the rule was when the alert last fired (nil before it ever fired): a rule
	// removed from the rules file still resolves its alert with the kind and labels it fired with.
	Episode *Episode
	// SilentSince and Scored are, for not_measured_for, when the silence began and the all-time
	// scored count then, as the last step saw them (zero when not recorded).
	SilentSince time.Time
	Scored      int64
}

// Episode is the part of a rule a firing alert's later notifications repeat.
type Episode struct {
	Kind        string            `json:"kind"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// Evidence is what the rule saw when the alert fired: pages show it beside the alert. Absent
	// from records an older build wrote.
	Evidence *schemas.AlertEvidence `json:"evidence,omitempty"`
}

//go:embed commit.lua
var commitLua string

//go:embed ack.lua
var ackLua string

//go:embed atrest.lua
var atRestLua string

var (
	commitScript = redis.NewScript(commitLua)
	ackScript    = redis.NewScript(ackLua + atRestLua)
	claimScript  = redis.NewScript(`
local ks = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, k in ipairs(ks) do redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[2]), k) end
return ks`)
)

// Redis keeps every lifecycle record and each sink's outbox under one hash tag, so that every
// script's keys are in one slot on Redis Cluster: a record hash per (rule, subject), an index set
// of records, one outbox list per record and sink, and per sink a sorted set of records with
// something to deliver, scored by when they may next be tried (which doubles as the delivery
// lease).
type Redis struct {
	rdb    redis.UniversalClient
	prefix string
	sinks  []string
	// Linger is how long a resolved or cleared record stays after its notifications were
	// delivered, so that a late compare-and-set against it still sees its revision.
	linger time.Duration
	now    func() time.Time // the clock of CurrentAlerts' "recent" (tests set it)
	// serverTime is Redis's clock (TIME), which every evaluator shares; tests set it.
	serverTime func(context.Context) (time.Time, error)
}

// NewRedis returns the alert store under prefix for the named sinks.
func NewRedis(rdb redis.UniversalClient, prefix string, sinks []string) (*Redis, error) {
	if prefix == "" || len(sinks) == 0 {
		return nil, errors.New("alert store: prefix and at least one sink are required")
	}
	return &Redis{rdb: rdb, prefix: prefix + ":{alerts}", sinks: sinks, linger: 24 * time.Hour, now: time.Now,
		serverTime: func(ctx context.Context) (time.Time, error) { return rdb.Time(ctx).Result() }}, nil
}

// Key is the record key of (rule, subject).
func (s *Redis) Key(rule, subject string) string {
	return s.prefix + ":s:" + schemas.JoinEscaped(rule, subject)
}

func (s *Redis) index() string          { return s.prefix + ":idx" }
func (s *Redis) recent() string         { return s.prefix + ":recent" }
func (s *Redis) due(sink string) string { return s.prefix + ":due:" + sink }

// outbox is the list of key's notifications for sink. It lives under its own namespace, not
// under the record key: a record key ends with a part users choose (a case id, a version), which
// may contain ':', so "<record>:ob:<sink>" could be another subject's record key.
func (s *Redis) outbox(key, sink string) string {
	return s.prefix + ":ob:" + sink + ":" + strings.TrimPrefix(key, s.prefix+":s:")
}
func msScore(t time.Time) int64 { return t.UnixMilli() }

// us is t in µs since the epoch as text, "0" for the zero time.
func us(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}

// fromUS is the inverse of us.
func fromUS(v string) time.Time {
	n, _ := strconv.ParseInt(v, 10, 64)
	if n == 0 {
		return time.Time{}
	}
	return time.UnixMicro(n).UTC()
}

// keysOfWorkspace keeps the record keys whose subject is of workspace ws. A record key is
// Key(rule, subject), and every subject key is a kind letter and the escaped parts, the workspace
// first ("a|acme|…", "d|acme|suite"): escaped once more in the record key, its workspace part
// follows the kind's "%7C".
func (s *Redis) keysOfWorkspace(keys []string, ws string) []string {
	part := schemas.JoinEscaped(schemas.JoinEscaped(ws))
	var out []string
	for _, k := range keys {
		_, subject, ok := strings.Cut(strings.TrimPrefix(k, s.prefix+":s:"), "|")
		if !ok {
			continue
		}
		_, rest, ok := strings.Cut(subject, "%7C")
		if ok && (rest == part || strings.HasPrefix(rest, part+"%7C")) {
			out = append(out, k)
		}
	}
	return out
}

// recordSubjects maps each rule of the records keys to its subjects' keys and their record keys.
func (s *Redis) recordSubjects(keys []string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, k := range keys {
		p, err := schemas.SplitEscaped(strings.TrimPrefix(k, s.prefix+":s:"))
		if err != nil || len(p) != 2 {
			continue
		}
		if out[p[0]] == nil {
			out[p[0]] = map[string]string{}
		}
		out[p[0]][p[1]] = k
	}
	return out
}

// Keys lists the records in the index.
func (s *Redis) Keys(ctx context.Context) ([]string, error) {
	ks, err := s.rdb.SMembers(ctx, s.index()).Result()
	if err != nil {
		return nil, fmt.Errorf("alert keys: %w", err)
	}
	return ks, nil
}

// Load reads records; absent ones come back with Rev 0.
func (s *Redis) Load(ctx context.Context, keys []string) (map[string]Stored, error) {
	out := make(map[string]Stored, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	cmds := make([]*redis.MapStringStringCmd, len(keys))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.HGetAll(ctx, k)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("alert load: %w", err)
	}
	for i, k := range keys {
		out[k] = decodeStored(cmds[i].Val())
	}
	return out, nil
}

func decodeStored(h map[string]string) Stored {
	var st Stored
	if len(h) == 0 {
		return st
	}
	st.Rev, _ = strconv.ParseInt(h["rev"], 10, 64)
	st.State = parseState(h["state"])
	st.ActiveAt, st.FiredAt, st.LastTrueAt = fromUS(h["active_at"]), fromUS(h["fired_at"]), fromUS(h["last_true_at"])
	st.ResolvedAt, st.LastSentAt = fromUS(h["resolved_at"]), fromUS(h["last_sent_at"])
	st.Rule, st.Subject.Key = h["rule"], h["subject"]
	_ = json.Unmarshal([]byte(h["fields"]), &st.Subject.Fields)
	st.SilentSince = fromUS(h["silent_since"])
	st.Scored, _ = strconv.ParseInt(h["scored"], 10, 64)
	if v, ok := h["episode"]; ok {
		var ep Episode
		if json.Unmarshal([]byte(v), &ep) == nil {
			st.Episode = &ep
		}
	}
	return st
}

// Commit writes next over the record at key if it is still at revision rev, and queues note (if
// any) in the outbox of every sink that takes its kind, atomically; sil (if any) is where the
// condition timed a silence from. It reports false when another evaluator changed the record
// first: reload and step again.
func (s *Redis) Commit(ctx context.Context, key string, rev int64, rule string, subj Subject, next Record,
	note *Notification, sil *silence, takes func(sink string, n Notify) bool, now time.Time) (bool, error) {
	fields, _ := json.Marshal(subj.Fields)
	keys := []string{key, s.index()}
	args := []any{rev, next.State.String(), us(next.ActiveAt), us(next.FiredAt), us(next.LastTrueAt),
		us(next.ResolvedAt), us(next.LastSentAt), rule, subj.Key, string(fields), s.linger.Milliseconds(), msScore(now)}
	var payload []byte
	if note != nil {
		var err error
		if payload, err = json.Marshal(note); err != nil {
			return false, err
		}
	}
	var episode []byte
	if note != nil && note.Kind == NotifyFiring.String() {
		episode, _ = json.Marshal(Episode{Kind: note.Alert.Kind, Labels: note.Alert.Labels, Annotations: note.Alert.Annotations,
			Evidence: &note.Alert.Evidence})
	}
	args = append(args, string(payload), note != nil && note.Kind == NotifyResend.String(), string(episode))
	if sil != nil && !sil.since.IsZero() {
		args = append(args, us(sil.since), sil.scored)
	} else {
		args = append(args, "", 0)
	}
	for _, sink := range s.sinks {
		take := note != nil && takes(sink, notifyOf(note.Kind))
		keys = append(keys, s.outbox(key, sink), s.due(sink))
		args = append(args, take)
	}
	keys = append(keys, s.recent())
	ok, err := commitScript.Run(ctx, s.rdb, keys, args...).Int()
	if err != nil {
		return false, fmt.Errorf("alert commit %s: %w", key, err)
	}
	return ok == 1, nil
}

func notifyOf(kind string) Notify {
	switch kind {
	case "firing":
		return NotifyFiring
	case "resend":
		return NotifyResend
	case "resolved":
		return NotifyResolved
	}
	return NotifyNone
}

// Claim leases up to limit records with notifications due for sink at now, for lease: until it
// ends no other caller claims them. It returns each record's pending notifications, oldest first.
func (s *Redis) Claim(ctx context.Context, sink string, now time.Time, lease time.Duration, limit int) (map[string][]Notification, error) {
	ks, err := claimScript.Run(ctx, s.rdb, []string{s.due(sink)}, now.UnixMilli(), lease.Milliseconds(), limit).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("alert claim %s: %w", sink, err)
	}
	out := map[string][]Notification{}
	for _, k := range ks {
		raw, err := s.rdb.LRange(ctx, s.outbox(k, sink), 0, 99).Result()
		if err != nil {
			return nil, fmt.Errorf("alert outbox %s: %w", k, err)
		}
		for _, r := range raw {
			var n Notification
			if err := json.Unmarshal([]byte(r), &n); err != nil {
				return nil, fmt.Errorf("alert outbox %s: %w", k, err)
			}
			out[k] = append(out[k], n)
		}
	}
	return out, nil
}

// Ack removes the first delivered notifications of key's outbox for sink (when the first still
// has firstID; when the outbox was trimmed from the front meanwhile, those up to lastID) and makes
// the record due again at retryAt if anything is left. A record resolved or cleared with nothing
// left to deliver lingers, then expires.
func (s *Redis) Ack(ctx context.Context, sink, key string, delivered int, firstID, lastID string, retryAt time.Time) error {
	keys := []string{s.due(sink), s.outbox(key, sink), key, s.index(), s.recent()}
	for _, o := range s.sinks {
		keys = append(keys, s.outbox(key, o))
	}
	if err := ackScript.Run(ctx, s.rdb, keys, delivered, firstID, msScore(retryAt), s.linger.Milliseconds(), lastID).Err(); err != nil {
		return fmt.Errorf("alert ack %s: %w", key, err)
	}
	return nil
}

// Retry makes key due for sink again at at (a failed delivery's backoff).
func (s *Redis) Retry(ctx context.Context, sink, key string, at time.Time) error {
	return s.rdb.ZAddXX(ctx, s.due(sink), redis.Z{Score: float64(at.UnixMilli()), Member: key}).Err()
}

// Current is one alert as GET /v1/alerts answers it (the read side's CurrentAlert, which the read
// side declares so that neither package imports the other; cmd converts): the rule, the kind,
// labels and annotations it fired with, its subject's fields, its state and its times.
type Current struct {
	Rule        string            `json:"rule"`
	Kind        string            `json:"kind"`
	Subject     string            `json:"subject"`
	Fields      map[string]string `json:"fields"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"` // pending, firing or resolved
	ActiveAt    time.Time         `json:"active_at"`
	FiredAt     *time.Time        `json:"fired_at"`
	ResolvedAt  *time.Time        `json:"resolved_at"`
	// Evidence is what the rule saw when the alert fired (null if it never did, or for a record
	// an older build wrote).
	Evidence *schemas.AlertEvidence `json:"evidence"`
}

// CurrentAlerts lists the alerts of workspace ws that are pending, firing or resolved within the
// last day (the linger of a record at rest), ordered by rule and subject, at most limit: what
// GET /v1/alerts answers. It reads the index and the records of ws alone (keysOfWorkspace), so a workspace's
// read costs its own current alerts, not other tenants' nor history. A pending alert has no kind yet (it never fired).
func (s *Redis) CurrentAlerts(ctx context.Context, ws string, limit int) ([]Current, error) {
	keys, err := s.Keys(ctx)
	if err != nil {
		return nil, err
	}
	// Resolved alerts at rest stay listed while their records linger (recent).
	since := s.now().Add(-s.linger).UnixMilli()
	resolved, err := s.rdb.ZRangeByScore(ctx, s.recent(), &redis.ZRangeBy{Min: strconv.FormatInt(since, 10), Max: "+inf"}).Result()
	if err != nil {
		return nil, fmt.Errorf("recent alerts: %w", err)
	}
	recs, err := s.Load(ctx, s.keysOfWorkspace(append(keys, resolved...), ws))
	if err != nil {
		return nil, err
	}
	var out []Current
	for _, st := range recs {
		if st.Rev == 0 || st.Subject.Fields["workspace"] != ws || st.State == StateInactive {
			continue
		}
		a := Current{Rule: st.Rule, Subject: st.Subject.Key, Fields: st.Subject.Fields, State: st.State.String(),
			ActiveAt: st.ActiveAt, Labels: map[string]string{}, Annotations: map[string]string{}}
		// A pending alert has not fired in this episode: an earlier episode's kind, labels and
		// evidence (kept while the resolved record lingered) are not its own.
		if ep := st.Episode; ep != nil && st.State != StatePending {
			a.Kind = ep.Kind
			if ep.Labels != nil {
				a.Labels = ep.Labels
			}
			if ep.Annotations != nil {
				a.Annotations = ep.Annotations
			}
			a.Evidence = ep.Evidence
		}
		if !st.FiredAt.IsZero() {
			a.FiredAt = &st.FiredAt
		}
		if st.State == StateResolved && !st.ResolvedAt.IsZero() {
			a.ResolvedAt = &st.ResolvedAt
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Current) int {
		if c := strings.Compare(a.Rule, b.Rule); c != 0 {
			return c
		}
		return strings.Compare(a.Subject, b.Subject)
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// SinkGrace is how long a sink may go unconfigured in every evaluator before its outboxes are
// dropped: far longer than a rolling restart, during which an older evaluator does not yet know
// a sink a newer one added (and must not drop what the newer one queues for it).
const SinkGrace = time.Hour

// sinksKey maps each sink any evaluator was configured with to when one last was (ms).
func (s *Redis) sinksKey() string { return s.prefix + ":sinks" }

// KeepSinks records that this store's sinks are configured at now and drops the outboxes of every
// sink no evaluator has been configured with for SinkGrace: a sink removed from the configuration
// would otherwise keep its queued notifications (one list per record) and its due set forever.
// It returns the sinks it forgot. Evaluators call it when they start and on their schedule.
func (s *Redis) KeepSinks(ctx context.Context) ([]string, error) {
	// Redis's clock, not the evaluator's: evaluators whose clocks differ would otherwise judge
	// one another's records by their own time, and one running ahead would forget a sink another
	// still has.
	now, err := s.serverTime(ctx)
	if err != nil {
		return nil, err
	}
	fields := make([]any, 0, 2*len(s.sinks))
	for _, sink := range s.sinks {
		fields = append(fields, sink, msScore(now))
	}
	if err := s.rdb.HSet(ctx, s.sinksKey(), fields...).Err(); err != nil {
		return nil, err
	}
	seen, err := s.rdb.HGetAll(ctx, s.sinksKey()).Result()
	if err != nil {
		return nil, err
	}
	var forgot []string
	for sink, at := range seen {
		ms, _ := strconv.ParseInt(at, 10, 64)
		if now.Sub(time.UnixMilli(ms)) < SinkGrace || slices.Contains(s.sinks, sink) {
			continue
		}
		if err := s.forgetSink(ctx, sink, now); err != nil {
			return forgot, err
		}
		forgot = append(forgot, sink)
	}
	return forgot, nil
}

// forgetSink deletes sink's outboxes (those its due set lists: every record with something queued
// for it), then its due set and its entry, a bounded number of records per command. A record
// resolved or inactive whose remaining outboxes are then empty is put at rest as a delivery would
// (forgetScript, atrest.lua).
func (s *Redis) forgetSink(ctx context.Context, sink string, now time.Time) error {
	for {
		keys, err := s.rdb.ZRange(ctx, s.due(sink), 0, 255).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		if _, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for _, k := range keys {
				ks := []string{s.due(sink), s.outbox(k, sink), k, s.index(), s.recent()}
				for _, other := range s.sinks {
					ks = append(ks, s.outbox(k, other))
				}
				forgetScript.Eval(ctx, pl, ks, "", "", msScore(now), s.linger.Milliseconds()) // EVAL: a pipeline cannot fall back from EVALSHA
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return s.rdb.HDel(ctx, s.sinksKey(), sink).Err()
}

// forgetScript drops one record's outbox for a forgotten sink, then puts the record at rest when
// nothing is left to deliver (atrest.lua, as after a delivery). KEYS as atrest.lua's, KEYS[2] the
// forgotten sink's outbox; ARGV[3] now (ms), ARGV[4] linger (ms).
var forgetScript = redis.NewScript(`
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], KEYS[3])
` + atRestLua)

// detectorKey is the key of the sequential detector of (rule, subject).
func (s *Redis) detectorKey(rule, subject string) string {
	return s.prefix + ":det:" + schemas.JoinEscaped(rule, subject)
}

// swapScript sets KEYS[1] to ARGV[2] for ARGV[3] ms if it still holds ARGV[1] ("" for absent).
var swapScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`)

// LoadDetectors reads the encoded detectors of keys ("" for absent), in one round trip.
func (s *Redis) LoadDetectors(ctx context.Context, keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make([]string, len(keys))
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}

// detectorSwap replaces a detector's encoding Old with New, kept for TTL after the write.
type detectorSwap struct {
	Key, Old, New string
	TTL           time.Duration
}

// SwapDetectors applies each swap whose key still holds its Old value, in one round trip, and
// reports which were applied: another evaluator may have stepped a detector first.
func (s *Redis) SwapDetectors(ctx context.Context, swaps []detectorSwap) ([]bool, error) {
	if len(swaps) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(swaps))
	for i, w := range swaps {
		cmds[i] = swapScript.Eval(ctx, pipe, []string{w.Key}, w.Old, w.New, w.TTL.Milliseconds())
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([]bool, len(swaps))
	for i, c := range cmds {
		n, _ := c.Int64()
		out[i] = n == 1
	}
	return out, nil
}
