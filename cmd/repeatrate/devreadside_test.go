package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestDevDemoServesReadSide runs `repeatrate dev --demo` on free ports as a person would: it reads
// the URL and token the command prints, and with them gets live numbers from the read side — the
// outcomes page of the demo's stepping correction (its counts grow between two loads), its badge,
// and its event stream (versions that grow) — while without the token the page asks for a sign-in
// and the API answers 401.
func TestDevDemoServesReadSide(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	started := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	base, token, demo, out := startDemo(t)
	noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(u, tok string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Without the token: the page sends to the sign-in form, the API answers 401.
	if code, _ := get(demo, ""); code != http.StatusSeeOther {
		t.Errorf("the demo page without a token answered %d, want 303 to /login", code)
	}
	q := url.Values{"workspace": {"demo"}, "model": {"support-bot"}, "run": {"prod"}, "checkpoint": {"v2"}, "artifact": {"prod"}}
	if code, _ := get(base+"v1/outcomes?"+q.Encode(), ""); code != http.StatusUnauthorized {
		t.Errorf("/v1/outcomes without a token answered %d, want 401", code)
	}

	// Signed in with the printed token (the login form's cookie), the page shows the stepping
	// correction's counts; a later load shows more.
	form := url.Values{"token": {token}}
	resp, err := noRedirect.PostForm(base+"login", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || len(cookies) != 1 {
		t.Fatalf("sign in with the printed token: %d %v", resp.StatusCode, cookies)
	}
	page := func() (scored int, body string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, demo, nil)
		req.AddCookie(cookies[0])
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		counts := regexp.MustCompile(`data-correction="fix-comeback"[\s\S]*?<td>all</td>[\s\S]*?data-testid="counts">\d+/(\d+)<`).FindStringSubmatch(string(b))
		if resp.StatusCode != http.StatusOK || counts == nil {
			return 0, string(b)
		}
		n, _ := strconv.Atoi(counts[1])
		return n, string(b)
	}
	first, body := 0, ""
	for first == 0 {
		if ctx.Err() != nil {
			t.Fatalf("the demo page never showed fix-comeback's counts:\n%s\n%s", body, lastLines(out.String(), 10))
		}
		time.Sleep(200 * time.Millisecond)
		first, body = page()
	}
	for _, want := range []string{"Correction outcomes", `data-testid="live"`, "% live ("} {
		if !strings.Contains(body, want) {
			t.Errorf("the demo page lacks %q", want)
		}
	}
	var later int
	for later <= first {
		if ctx.Err() != nil {
			t.Fatalf("the demo page's scored count stayed at %d: the numbers are not live", first)
		}
		time.Sleep(500 * time.Millisecond)
		later, _ = page()
	}

	// The badge, with the token.
	q.Set("correction_id", "fix-comeback")
	if code, svg := get(base+"v1/badge.svg?"+q.Encode(), token); code != http.StatusOK || !regexp.MustCompile(`\d+\.\d% live \(\d+/\d+, \d+ unscored\)`).MatchString(svg) {
		t.Errorf("badge: %d %s", code, svg)
	}

	// The stream: the current snapshot, then newer versions of it as the demo goes on.
	sq := url.Values{"workspace": {"demo"}, "model": {"support-bot"}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"v1/stream?"+sq.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	if sresp.StatusCode != http.StatusOK || !strings.HasPrefix(sresp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %s", sresp.StatusCode, sresp.Header.Get("Content-Type"))
	}
	var ids []int64
	sc := bufio.NewScanner(sresp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for len(ids) < 3 && sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			n, err := strconv.ParseInt(id, 10, 64)
			if err != nil || (len(ids) > 0 && n <= ids[len(ids)-1]) {
				t.Fatalf("stream ids %v then %q: not growing versions", ids, id)
			}
			ids = append(ids, n)
		}
	}
	if len(ids) < 3 {
		t.Fatalf("the stream gave %d events before it ended (%v)", len(ids), sc.Err())
	}
	t.Logf("dev printed %s and %s; fix-comeback scored %d then %d; stream versions %v; %v after the build",
		base, demo, first, later, ids, time.Since(started).Round(time.Millisecond))
}

// startDemo runs `repeatrate dev --demo` on free ports, as a person would, until the test ends,
// and returns what it prints: the read side's URL, the token and the demo page.
func startDemo(t *testing.T) (base, token, demo string, out *lockedBuffer) {
	t.Helper()
	return startDev(t, true)
}

// startDev runs `repeatrate dev` (with --demo when demo) on free ports until the test ends, and
// returns what it prints: the read side's URL, the token and, with the demo, its page.
func startDev(t *testing.T, demo bool) (base, token, demoPage string, out *lockedBuffer) {
	t.Helper()
	bin := buildBinary(t)
	args := []string{"dev", "--kafka-addr=127.0.0.1:0", "--redis-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0"}
	if demo {
		args = append(args, "--demo")
	}
	cmd := exec.Command(bin, args...)
	out = &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	// What dev prints: the read side's URL, the token, and the demo's outcomes page.
	printed := regexp.MustCompile(`read side: +(http://\S+/) `)
	tokenLine := regexp.MustCompile(`token: +(rr_dev_[0-9a-f]+)`)
	demoLine := regexp.MustCompile(`demo page: +(http://\S+)`)
	printDeadline := time.Now().Add(20 * time.Second) // dev prints them before it starts processing
	for base == "" || token == "" || (demo && demoPage == "") {
		if time.Now().After(printDeadline) {
			t.Fatalf("dev did not print the read side's URL, token and demo page:\n%s", lastLines(out.String(), 20))
		}
		text := out.String()
		if m := printed.FindStringSubmatch(text); m != nil {
			base = m[1]
		}
		if m := tokenLine.FindStringSubmatch(text); m != nil {
			token = m[1]
		}
		if m := demoLine.FindStringSubmatch(text); m != nil {
			demoPage = m[1]
		}
		time.Sleep(50 * time.Millisecond)
	}
	if strings.Contains(base, ":0/") || (demo && !strings.HasPrefix(demoPage, base)) {
		t.Fatalf("dev printed %q and %q: not an address to open", base, demoPage)
	}
	// dev prints the addresses before its HTTP server listens: wait until it answers at all.
	for up := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(base + "healthz")
		if err == nil {
			resp.Body.Close()
			return base, token, demoPage, out
		}
		if time.Now().After(up) {
			t.Fatalf("dev's HTTP server did not answer within 20 s:\n%s", lastLines(out.String(), 20))
		}
	}
}

// The embedded Redis counts TTLs down as the processor expects of a Redis: a key set to expire
// goes. (miniredis alone never expires anything, so dev kept every idle aggregate forever.)
func TestDevRedisExpiresKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	_, _, _, out := startDev(t, false)
	addr := regexp.MustCompile(`embedded Redis: +(\S+)`).FindStringSubmatch(out.String())
	if addr == nil {
		t.Fatalf("dev did not print the embedded Redis's address:\n%s", lastLines(out.String(), 20))
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr[1]})
	defer rdb.Close()
	ctx := t.Context()
	if err := rdb.Set(ctx, "expiry-probe", "x", 1500*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		n, err := rdb.Exists(ctx, "expiry-probe").Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			ttl, _ := rdb.PTTL(ctx, "expiry-probe").Result()
			t.Fatalf("a key set to expire in 1.5 s is still there after 15 s (PTTL %v)", ttl)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
