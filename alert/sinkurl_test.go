package alert

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A sink's URL often holds a secret in its path (a chat webhook's /services/T0SECRET/…) or query
// (a proxy's ?token=…): no delivery error, which the delivery loop logs, carries either.
func TestSinkErrorsCarryNoURLSecret(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: every send fails to connect
	base := "http://user:pw0SECRET@" + addr + "/services/T0SECRET/B0SECRET?token=tok0SECRET"
	wh, err := NewWebhook(base, []byte(strings.Repeat("s", MinWebhookSecret)), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	notes := []Notification{{ID: "n", Kind: "firing", At: t0}}
	for _, s := range []Sink{wh, NewAlertmanager(base, time.Hour, time.Second)} {
		err := s.Send(context.Background(), notes)
		if err == nil {
			t.Fatalf("%s: sent to a closed port", s.Name())
		}
		if strings.Contains(err.Error(), "SECRET") || !strings.Contains(err.Error(), "http://"+addr+"/…") {
			t.Errorf("%s: error %q, want the url as http://%s/… only", s.Name(), err, addr)
		}
	}
	if _, err := NewWebhook("ftp://x/services/T0SECRET", []byte(strings.Repeat("s", MinWebhookSecret)), time.Second, time.Now); err == nil ||
		strings.Contains(err.Error(), "SECRET") {
		t.Errorf("a refused webhook url: %v", err)
	}
}

// The Alertmanager API path is joined to the base URL's path, and its query stays a query.
func TestAlertmanagerPathKeepsTheQuery(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.URL.Path + "?" + r.URL.RawQuery
	}))
	defer srv.Close()
	am := NewAlertmanager(srv.URL+"/prefix/?token=abc", time.Hour, 5*time.Second)
	if err := am.Send(context.Background(), []Notification{{ID: "n", Kind: "firing", At: t0}}); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != "/prefix/api/v2/alerts?token=abc" {
		t.Fatalf("posted to %q, want /prefix/api/v2/alerts?token=abc", g)
	}
}
