package alert

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

// receiver is a webhook endpoint that verifies the signature the way the README tells a receiver
// to — its own HMAC-SHA256 over timestamp "." body, not Sign — and keeps what verified.
type receiver struct {
	secret   []byte
	mu       sync.Mutex
	accepted [][]byte
	refused  int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	ts := r.Header.Get("X-Repeatrate-Timestamp")
	m := hmac.New(sha256.New, rc.secret)
	m.Write([]byte(ts + "." + string(body)))
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	sec, _ := strconv.ParseInt(ts, 10, 64)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !hmac.Equal([]byte(r.Header.Get("X-Repeatrate-Signature")), []byte(want)) ||
		time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute ||
		r.Header.Get("Content-Type") != "application/cloudevents-batch+json" || r.Method != http.MethodPost {
		rc.refused++
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	rc.accepted = append(rc.accepted, body)
	w.WriteHeader(http.StatusNoContent)
}

func testNotification(t *testing.T) Notification {
	t.Helper()
	tb := NewTable()
	tb.PutSnapshot(snap("live", 1, [2]int64{150, 1000}, [2]int64{270, 7000}, t0))
	r := mustRule(t, "- {name: back, kind: change, min_increase: 0.05}")
	c := Evaluate(r, tb, t0)[0]
	return *(&Evaluator{}).notification(r, c, Record{State: StateFiring, ActiveAt: t0, FiredAt: t0}, NotifyFiring, t0, nil)
}

// TestWebhookSigned: a real HTTP receiver verifies the signature of what the webhook sink posts,
// and gets the CloudEvents the alerts topic carries, with the same id; a sink with the wrong
// secret is refused, its Send fails (so the delivery loop retries) and no error shows a secret.
func TestWebhookSigned(t *testing.T) {
	secret := []byte("s3cret-for-the-webhook-test")
	rc := &receiver{secret: secret}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	n := testNotification(t)

	wh, err := NewWebhook(srv.URL+"/hook", secret, 5*time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if !wh.Takes(NotifyFiring) || !wh.Takes(NotifyResolved) || wh.Takes(NotifyResend) {
		t.Error("the webhook takes firing and resolved only")
	}
	if err := wh.Send(context.Background(), []Notification{n}); err != nil {
		t.Fatalf("signed send refused: %v", err)
	}
	if len(rc.accepted) != 1 || rc.refused != 0 {
		t.Fatalf("accepted %d, refused %d", len(rc.accepted), rc.refused)
	}
	var evs []struct {
		ID      string        `json:"id"`
		Type    string        `json:"type"`
		Subject string        `json:"subject"`
		Data    schemas.Alert `json:"data"`
	}
	if err := json.Unmarshal(rc.accepted[0], &evs); err != nil {
		t.Fatal(err)
	}
	o := Out(&n)
	kafkaEvent, _ := sink.Encode(&o)
	var ke struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(kafkaEvent, &ke)
	if len(evs) != 1 || evs[0].Type != schemas.TypeAlertFiring || evs[0].ID != ke.ID || evs[0].Data.Rule != "back" ||
		evs[0].Data.Evidence.Test == nil {
		t.Errorf("events %+v (Kafka id %s)", evs, ke.ID)
	}

	wrong := []byte("not-the-secret-of-the-receiver")
	bad, _ := NewWebhook(srv.URL+"/hook", wrong, 5*time.Second, time.Now)
	err = bad.Send(context.Background(), []Notification{n})
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("wrong secret: err %v, want a 401", err)
	}
	if rc.refused != 1 || len(rc.accepted) != 1 {
		t.Errorf("accepted %d, refused %d after the wrong secret", len(rc.accepted), rc.refused)
	}
	if strings.Contains(err.Error(), string(wrong)) || strings.Contains(err.Error(), string(secret)) {
		t.Errorf("error shows a secret: %v", err)
	}
}

// TestVerifySignature: what VerifySignature accepts and refuses.
func TestVerifySignature(t *testing.T) {
	secret := []byte("0123456789abcdef")
	body := []byte(`[{"id":"x"}]`)
	now := time.Unix(1_800_000_000, 0)
	ts := strconv.FormatInt(now.Unix(), 10)
	good := Sign(secret, ts, body)
	tests := []struct {
		name, ts, sig string
		body          []byte
		ok            bool
	}{
		{"signed as documented", ts, good, body, true},
		{"body changed", ts, good, []byte(`[{"id":"y"}]`), false},
		{"timestamp changed", strconv.FormatInt(now.Unix()-1, 10), good, body, false},
		{"other secret", ts, Sign([]byte("fedcba9876543210"), ts, body), body, false},
		{"replayed ten minutes later", strconv.FormatInt(now.Unix()-600, 10), Sign(secret, strconv.FormatInt(now.Unix()-600, 10), body), body, false},
		{"timestamp not a number", "soon", Sign(secret, "soon", body), body, false},
		{"no signature", ts, "", body, false},
	}
	for _, tc := range tests {
		err := VerifySignature(secret, tc.ts, tc.sig, tc.body, now, 5*time.Minute)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrSignature)) {
			t.Errorf("%s: err %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestNewWebhookRefuses: a short secret or a URL that is not HTTP stops the start, without
// showing the secret.
func TestNewWebhookRefuses(t *testing.T) {
	if _, err := NewWebhook("http://127.0.0.1:1/x", []byte("short-secret"), time.Second, time.Now); err == nil ||
		strings.Contains(err.Error(), "short-secret") {
		t.Errorf("short secret: %v", err)
	}
	if _, err := NewWebhook("ftp://x", []byte("0123456789abcdef"), time.Second, time.Now); err == nil {
		t.Error("ftp url accepted")
	}
}
