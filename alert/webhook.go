package alert

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/repeatrate/repeatrate/sink"
)

// Webhook signature headers (README, Alerting). The signature is
//
//	X-Repeatrate-Signature: sha256=<hex of HMAC-SHA256(secret, timestamp + "." + body)>
//
// where timestamp is the X-Repeatrate-Timestamp header, the sending time in Unix seconds, and body
// the request body as received. A receiver recomputes it, compares in constant time and refuses
// timestamps too far from its clock, so a captured request cannot be replayed later.
const (
	HeaderSignature = "X-Repeatrate-Signature"
	HeaderTimestamp = "X-Repeatrate-Timestamp"
	// WebhookContentType is the body's type: a JSON array of structured CloudEvents.
	WebhookContentType = "application/cloudevents-batch+json"
	// MinWebhookSecret is the shortest secret accepted, in bytes.
	MinWebhookSecret = 16
)

// ErrSignature marks a webhook request whose signature does not verify.
var ErrSignature = errors.New("webhook signature")

// Webhook posts firing and resolved notifications to an HTTP endpoint: one POST per delivery with
// a JSON array of the same CloudEvents the alerts topic carries (same ids, so a receiver can drop a
// copy), signed with HMAC-SHA256 under a shared secret. Any 2xx accepts the batch; anything else is
// a failure the delivery loop retries with backoff. The secret is never logged nor put in an error.
type Webhook struct {
	url    string
	secret []byte
	client *http.Client
	now    func() time.Time
}

var _ Sink = (*Webhook)(nil)

// NewWebhook returns the webhook sink posting to url, signing with secret (at least
// MinWebhookSecret bytes); now stamps each request.
func NewWebhook(url string, secret []byte, timeout time.Duration, now func() time.Time) (*Webhook, error) {
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		// Not the url itself: its path or query may hold a secret.
		return nil, errors.New("alert webhook: the url does not start with http:// or https://")
	}
	if len(secret) < MinWebhookSecret {
		return nil, fmt.Errorf("alert webhook: the secret has %d bytes, at least %d are required", len(secret), MinWebhookSecret)
	}
	return &Webhook{url: url, secret: bytes.Clone(secret), client: noRedirects(timeout), now: now}, nil
}

// Name is "webhook".
func (w *Webhook) Name() string { return "webhook" }

// Takes firing and resolved notifications; resends are for Alertmanager.
func (w *Webhook) Takes(n Notify) bool { return n == NotifyFiring || n == NotifyResolved }

// Send posts notes (oldest first) in one signed request.
func (w *Webhook) Send(ctx context.Context, notes []Notification) error {
	var body bytes.Buffer
	body.WriteByte('[')
	for i := range notes {
		o := Out(&notes[i])
		b, err := sink.Encode(&o)
		if err != nil {
			return err
		}
		if i > 0 {
			body.WriteByte(',')
		}
		body.Write(b)
	}
	body.WriteByte(']')
	ts := strconv.FormatInt(w.now().Unix(), 10)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body.Bytes()))
	if err != nil {
		return fmt.Errorf("webhook: %w", redact(err))
	}
	req.Header.Set("Content-Type", WebhookContentType)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, Sign(w.secret, ts, body.Bytes()))
	resp, err := w.client.Do(req)
	if err != nil {
		return fmt.Errorf("webhook: %w", redact(err))
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// Sign is the X-Repeatrate-Signature value of body sent at timestamp (Unix seconds as text).
func Sign(secret []byte, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// VerifySignature checks a received webhook request: the signature must be Sign's for the
// timestamp and body (compared in constant time), and the timestamp within tolerance of now.
// Errors wrap ErrSignature.
func VerifySignature(secret []byte, timestamp, signature string, body []byte, now time.Time, tolerance time.Duration) error {
	sec, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: timestamp %q is not Unix seconds", ErrSignature, timestamp)
	}
	if d := now.Sub(time.Unix(sec, 0)).Abs(); d > tolerance {
		return fmt.Errorf("%w: timestamp is %s from now, beyond %s", ErrSignature, d.Round(time.Second), tolerance)
	}
	if !hmac.Equal([]byte(signature), []byte(Sign(secret, timestamp, body))) {
		return fmt.Errorf("%w: does not match", ErrSignature)
	}
	return nil
}
