package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

// Kafka publishes firing and resolved notifications as CloudEvents
// (repeatrate.alert.firing.v1, repeatrate.alert.resolved.v1) on the alerts topic, keyed by rule
// and subject. The CloudEvent id derives from the notification id, so a copy is recognisable.
type Kafka struct {
	w sink.MessageWriter
}

var _ Sink = (*Kafka)(nil)

// NewKafka returns the Kafka sink on a synchronous, fully acknowledged writer.
func NewKafka(w sink.MessageWriter) *Kafka { return &Kafka{w: w} }

// Name is "kafka".
func (k *Kafka) Name() string { return "kafka" }

// Takes firing and resolved notifications; resends are for Alertmanager.
func (k *Kafka) Takes(n Notify) bool { return n == NotifyFiring || n == NotifyResolved }

// Out renders a notification as an output event.
func Out(n *Notification) sink.Out {
	typ := schemas.TypeAlertFiring
	if n.Kind == NotifyResolved.String() {
		typ = schemas.TypeAlertResolved
	}
	return sink.Out{Type: typ, Subject: schemas.JoinEscaped(n.Alert.Rule, n.Alert.Subject), Time: n.At, IDSeed: n.ID, Data: &n.Alert}
}

// Send publishes notes and returns once Kafka acknowledged them.
func (k *Kafka) Send(ctx context.Context, notes []Notification) error {
	msgs := make([]kafka.Message, 0, len(notes))
	for i := range notes {
		o := Out(&notes[i])
		m, err := sink.Record(&o, time.Now())
		if err != nil {
			return err
		}
		msgs = append(msgs, m)
	}
	if err := k.w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("publish %d alerts: %w", len(msgs), err)
	}
	return nil
}

// Alertmanager posts alerts to Alertmanager's v2 API (POST /api/v2/alerts): a firing alert when it
// fires and again at every resend, valid for four resend intervals (so Alertmanager resolves it
// by itself if every evaluator is gone), and with endsAt at its resolution when it resolves. A
// 400, 413 or 422 answer is a refusal of the content (ErrRefused); any other failure is retried.
type Alertmanager struct {
	url    string
	client *http.Client
	// validFor is how long a posted firing alert stays active without being posted again.
	validFor time.Duration
	now      func() time.Time
}

var _ Sink = (*Alertmanager)(nil)

// NewAlertmanager returns a client of the Alertmanager at baseURL (http://host:port, with any path
// prefix). resend is the rules' longest resend interval.
func NewAlertmanager(baseURL string, resend time.Duration, timeout time.Duration) *Alertmanager {
	return &Alertmanager{url: joinPath(baseURL, "/api/v2/alerts"), client: noRedirects(timeout), validFor: 4 * resend, now: time.Now}
}

// joinPath appends path to base's path, keeping its query (a proxy's ?token=…) where it was.
func joinPath(base, path string) string {
	u, err := url.Parse(base)
	if err != nil {
		return strings.TrimRight(base, "/") + path
	}
	u.Path, u.RawPath = strings.TrimRight(u.Path, "/")+path, ""
	return u.String()
}

// Redacted is rawURL as it may be logged: scheme://host/… without user, path or query, which
// often carry a secret (a chat webhook's path, a proxy's ?token=).
func Redacted(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "(unparsable url)"
	}
	return u.Scheme + "://" + u.Host + "/…"
}

// redact replaces the URL that net/http puts in a request's error with its Redacted form: the
// error is logged by the delivery loop.
func redact(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = Redacted(ue.URL)
	}
	return err
}

// noRedirects is an HTTP client that does not follow redirects: a 3xx answer to a POST is a
// failed delivery (following a 302 would GET the new address without the body and take its 200
// for an acceptance).
func noRedirects(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// Name is "alertmanager".
func (a *Alertmanager) Name() string { return "alertmanager" }

// Takes every notification.
func (a *Alertmanager) Takes(Notify) bool { return true }

// postableAlert is Alertmanager's v2 PostableAlert.
type postableAlert struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
}

// Labels are the Alertmanager labels of an alert: the rule's labels, alertname (the rule), kind,
// and the subject's fields.
func Labels(al *schemas.Alert) map[string]string {
	l := maps.Clone(al.Fields)
	if l == nil {
		l = map[string]string{}
	}
	maps.Copy(l, al.Labels)
	l["alertname"], l["kind"] = al.Rule, al.Kind
	return l
}

// postable is n as posted at time sent. A firing alert stays valid validFor from when it is sent,
// not from when it was queued: one queued while Alertmanager was down would otherwise arrive
// already ended. A resolution ends at its resolution time, but never before the alert's start
// (Alertmanager refuses endsAt < startsAt, which a resolving evaluator whose clock is behind the
// firing one's would send).
func (a *Alertmanager) postable(n *Notification, sent time.Time) postableAlert {
	ann := maps.Clone(n.Alert.Annotations)
	if ann == nil {
		ann = map[string]string{}
	}
	ev, _ := json.Marshal(n.Alert.Evidence)
	ann["evidence"] = string(ev)
	ann["subject"] = n.Alert.Subject
	p := postableAlert{Labels: Labels(&n.Alert), Annotations: ann, StartsAt: n.Alert.FiredAt, EndsAt: later(n.At, sent).Add(a.validFor)}
	if n.Alert.ResolvedAt != nil {
		p.EndsAt = later(*n.Alert.ResolvedAt, n.Alert.FiredAt)
	}
	return p
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Send posts notes in one request.
func (a *Alertmanager) Send(ctx context.Context, notes []Notification) error {
	body := make([]postableAlert, len(notes))
	sent := a.now()
	for i := range notes {
		body[i] = a.postable(&notes[i], sent)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("alertmanager: %w", redact(err))
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("alertmanager: %w", redact(err))
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		err := fmt.Errorf("alertmanager: %s: %s", resp.Status, bytes.TrimSpace(msg))
		if refusal(resp.StatusCode) {
			return fmt.Errorf("%w: %w", ErrRefused, err)
		}
		return err
	}
	return nil
}

// ErrRefused marks a send the receiver refused for good: sending the same notifications again
// would be refused again. The evaluator drops a refused notification from its outbox (counting
// and logging it) instead of retrying it forever.
var ErrRefused = errors.New("refused")

// refusal reports whether an HTTP status refuses the notification itself, for good: 400 (bad
// request), 413 (too large) and 422 (unprocessable). Every other answer is retried, 4xx included:
// 401, 403 and 404 say the configuration is wrong (a proxy's credentials, a path prefix), and
// dropping on them would lose every notification until someone noticed; 408 and 429 ask to try
// again later.
func refusal(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return true
	}
	return false
}
