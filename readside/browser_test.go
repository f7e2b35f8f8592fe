package readside_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/readside"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// browserToken reads workspace acme only.
const browserToken = "rr-browser-test-token-0123456789"

// event renders one structured CloudEvent as the Kafka message that carries it.
func event(id, typ string, data map[string]any) kafka.Message {
	b, _ := json.Marshal(map[string]any{"specversion": "1.0", "id": id, "source": "browser-test", "type": typ, "data": data})
	return kafka.Message{Value: b}
}

var browserScope = map[string]string{"workspace": "acme", "model": "support-bot", "run": "prod", "checkpoint": "ckpt-7", "artifact": "chat"}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// attempts returns live attempts of correction corr: confirmed repeats, then passed, then
// unscored ones, occurring one second apart from at.
func attempts(corr string, confirmed, passed, unscored int, at time.Time, tag string) []kafka.Message {
	var out []kafka.Message
	for i := range confirmed + passed + unscored {
		outcome := "passed"
		switch {
		case i < confirmed:
			outcome = "confirmed_repeat"
		case i >= confirmed+passed:
			outcome = "unscored"
		}
		occ := at.Add(time.Duration(i) * time.Second)
		id := fmt.Sprintf("%s-%s-%d", corr, tag, i)
		out = append(out, event(id, "repeatrate.live.attempt.v1", map[string]any{"scope": browserScope, "correction_id": corr,
			"opportunity_id": id, "outcome": outcome, "occurred_at": stamp(occ), "assessed_at": stamp(occ)}))
	}
	return out
}

// checks returns correction checks of corr (eval results of suite "checks" that also count for the
// correction): failed ones (confirmed repeats), passed ones, then errored ones (unscored).
func checks(corr string, fail, pass, errored int, at time.Time) []kafka.Message {
	var out []kafka.Message
	for i := range fail + pass + errored {
		result := "pass"
		switch {
		case i < fail:
			result = "fail"
		case i >= fail+pass:
			result = "error"
		}
		occ := at.Add(time.Duration(i) * time.Second)
		id := fmt.Sprintf("%s-check-%d", corr, i)
		out = append(out, event(id, "repeatrate.eval.result.v1", map[string]any{"scope": browserScope, "suite": "checks",
			"case_id": id, "version": "v1", "version_seq": 1, "run_index": 0, "runs": 1, "result": result,
			"correction_id": corr, "opportunity_id": id, "occurred_at": stamp(occ), "assessed_at": stamp(occ)}))
	}
	return out
}

// suiteRuns are the graded runs of suite "qa": six cases, two runs each, in versions v1–v3.
// Outcomes per version ("pp" both runs pass, "pf" one fails, "ff" both fail, "" no run):
//
//	c-pass  pp pp pp   always pass
//	c-fail  ff ff ff   always fail
//	c-flip  pp pp pf   discriminating, regressed in v3
//	c-fixed ff ff pp   discriminating, fixed in v3
//	c-gone  pp pp --   too new (two outcomes; min_history 3)
//	c-new   -- -- pp   too new
func suiteRuns(versions []int, at time.Time) []kafka.Message {
	table := map[string][3]string{
		"c-pass": {"pp", "pp", "pp"}, "c-fail": {"ff", "ff", "ff"}, "c-flip": {"pp", "pp", "pf"},
		"c-fixed": {"ff", "ff", "pp"}, "c-gone": {"pp", "pp", ""}, "c-new": {"", "", "pp"},
	}
	var out []kafka.Message
	for _, v := range versions {
		for _, c := range []string{"c-pass", "c-fail", "c-flip", "c-fixed", "c-gone", "c-new"} {
			for run, r := range table[c][v-1] {
				result := map[rune]string{'p': "pass", 'f': "fail"}[r]
				occ := at.Add(time.Duration(len(out)) * time.Second)
				out = append(out, event(fmt.Sprintf("qa-%s-v%d-%d", c, v, run), "repeatrate.eval.result.v1", map[string]any{
					"scope": browserScope, "suite": "qa", "case_id": c, "version": fmt.Sprintf("v%d", v), "version_seq": v,
					"run_index": run, "runs": 2, "result": result, "occurred_at": stamp(occ), "assessed_at": stamp(occ)}))
			}
		}
	}
	return out
}

type nopDeadLetters struct{ t *testing.T }

func (d nopDeadLetters) Send(_ context.Context, dls []consumer.DeadLetter) error {
	if len(dls) == 0 {
		return nil
	}
	d.t.Errorf("%d known events were dead-lettered: %+v", len(dls), dls)
	return nil
}

// TestBrowserPages (integration: real Redis and Kafka, headless Chromium) puts known events
// through the processor (decode, Redis stores, publish to Kafka, read-side recorder), serves the
// real HTTP server, signs in with a token through the login form, and reads the outcomes page and
// a suite page as a browser renders them: rates, counts, intervals, windows, "not measured", the
// badge, suite buckets, floor and ceiling, stability and which cases moved. Screenshots are left
// in test-artifacts/browser.
func TestBrowserPages(t *testing.T) {
	client := testenv.Redis(t)
	brokers := testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	started := time.Now()
	name := testenv.Name(t, "browser")
	testenv.CleanPrefix(t, client, name)

	// The processor's output goes to a topic of its own on the real broker.
	kc := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	if resp, err := kc.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: name, NumPartitions: 1, ReplicationFactor: 1}}}); err != nil || resp.Errors[name] != nil {
		t.Fatalf("create topic: %v %v", err, resp)
	}
	defer kc.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{name}})
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: name, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()

	rcfg := aggregator.RedisConfig{Prefix: name, Retention: 30 * 24 * time.Hour, Group: name, Pending: aggregator.NewPending()}
	rates, err := aggregator.NewRedis(client, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	suiteCfg := suite.Config{MinHistory: 3, Ks: []int{1, 2}}
	suites, err := suite.NewRedis(client, rcfg, suiteCfg)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	log := zap.NewNop()
	catalog := readside.NewCatalog(client, name, time.Hour)
	rec := readside.NewRecorder(sink.NewKafka(w, w, w), catalog, nil, log)
	// The processor's clock: two batches a minute apart, so each aggregate keeps two history points.
	t0 := time.Now().UTC().Truncate(time.Minute).Add(-5 * time.Minute)
	clock := t0
	proc, err := consumer.NewProcessor(consumer.ProcessorConfig{Suite: suiteCfg}, dec, rates, suites, rec, nopDeadLetters{t},
		func() time.Time { return clock }, log, consumer.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	// fix-solid: 400 scored live attempts, 4 confirmed three hours ago and 6 in the last hour, and
	// 30 correction checks; fix-wide: 4 scored attempts and 1 unscored, 2 errored checks.
	batches := [][]kafka.Message{
		concat(attempts("fix-solid", 4, 196, 0, t0.Add(-3*time.Hour), "old"), attempts("fix-wide", 1, 1, 1, t0.Add(-20*time.Minute), "a"),
			checks("fix-solid", 3, 27, 0, t0.Add(-40*time.Minute)), suiteRuns([]int{1, 2}, t0.Add(-50*time.Minute))),
		concat(attempts("fix-solid", 6, 194, 0, t0.Add(-30*time.Minute), "new"), attempts("fix-wide", 0, 2, 0, t0.Add(-10*time.Minute), "b"),
			checks("fix-wide", 0, 0, 2, t0.Add(-15*time.Minute)), suiteRuns([]int{3}, t0.Add(-5*time.Minute))),
	}
	for i, b := range batches {
		clock = t0.Add(time.Duration(i) * time.Minute)
		if err := proc.Handle(ctx, b); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	tokens, err := auth.NewStore([]auth.TokenConfig{{Name: "acme-reader", SHA256: auth.Hash(browserToken), Workspaces: map[string]string{"acme": "read"}}})
	if err != nil {
		t.Fatal(err)
	}
	// The alert store is a fixed list here (package alert tests its records; cmd/repeatrate the
	// demo's alert end to end): a firing alert on fix-solid's live rate, and a resolved one on its
	// badge, which read live.
	fired, firedBefore, resolved := clock.Add(-40*time.Minute), clock.Add(-3*time.Hour), clock.Add(-2*time.Hour)
	alerts := browserAlerts(fired, firedBefore, resolved)
	srv := readside.NewHTTP(readside.HTTPConfig{Tokens: tokens, Catalog: catalog, Suites: suites, Alerts: alerts}, rates, prometheus.NewRegistry(),
		func() time.Time { return clock }, log)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, l) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	base := "http://" + l.Addr().String()

	bctx := testenv.Browser(t, ctx, 1280, 1000)
	dir := testenv.ArtifactDir(t, "browser")
	shot := func(file string) {
		t.Helper()
		testenv.Screenshot(t, bctx, dir, file)
		t.Logf("screenshot: %s", filepath.Join(dir, file))
	}
	location := func() string {
		t.Helper()
		loc, err := chromedp.Run(bctx, chromedp.Location())
		if err != nil {
			t.Fatal(err)
		}
		return loc
	}

	// A page without a token goes to the login form; the token signs in (a cookie) and brings the
	// reader back to that page; the index lists the workspace's scope and suites.
	outcomesURL := base + "/ui/outcomes?artifact=chat&checkpoint=ckpt-7&model=support-bot&run=prod&workspace=acme"
	if err := chromedp.Do(bctx,
		chromedp.Navigate(outcomesURL),
		chromedp.WaitVisible(chromedp.CSS(`input[name=token]`)),
	); err != nil {
		t.Fatalf("open a page without a token: %v", err)
	}
	if loc := location(); !strings.HasPrefix(loc, base+"/login?next=") {
		t.Errorf("a page without a token went to %s, want the login form", loc)
	}
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.CSS(`input[name=token]`), browserToken),
		chromedp.Click(chromedp.CSS(`form[action="/login"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`section[data-correction="fix-wide"]`)),
	); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	if loc := location(); loc != outcomesURL {
		t.Errorf("signed in, the reader landed on %s, want the page that asked: %s", loc, outcomesURL)
	}
	if err := chromedp.Do(bctx,
		chromedp.Navigate(base+"/?workspace=acme"),
		chromedp.WaitVisible(chromedp.CSS(`a[href^="/ui/outcomes"]`)),
	); err != nil {
		t.Fatalf("the index: %v", err)
	}
	index, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`body`)))
	if err != nil {
		t.Fatal(err)
	}
	// Each correction with its badge, its 24h rate and the alert firing on it.
	for _, want := range []string{"Scopes of acme", "support-bot", "qa", "checks", "fix-solid", "24h 2.5% of 400 ⚠ correction-regressed-fast firing",
		"fix-wide", "24h 25.0% of 4"} {
		if !strings.Contains(index, want) {
			t.Errorf("the index does not show %q:\n%s", want, index)
		}
	}
	if strings.Count(index, "⚠") != 1 {
		t.Errorf("the index shows %d firing alerts, want fix-solid's one:\n%s", strings.Count(index, "⚠"), index)
	}

	// The outcomes page, reached by the index's link.
	if err := chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`a[href^="/ui/outcomes"]`)),
		chromedp.WaitVisible(chromedp.CSS(`section[data-correction="fix-wide"]`)),
	); err != nil {
		t.Fatalf("outcomes page: %v", err)
	}
	if loc := location(); loc != outcomesURL {
		t.Errorf("the index linked to %s, want %s", loc, outcomesURL)
	}
	if err := chromedp.Do(bctx, badgesSettled); err != nil {
		t.Fatalf("the outcomes page's badges did not finish loading: %v", err)
	}
	page, err := chromedp.Run(bctx, chromedp.Evaluate[outcomesPage](readOutcomesJS))
	if err != nil {
		t.Fatalf("read the outcomes page: %v", err)
	}
	shot("outcomes.png")
	checkOutcomes(t, page)
	checkCharts(t, catalog, page, clock, 24*time.Hour, false, map[string][]string{
		"fix-solid live": {fmt.Sprint("fired ", fired.Unix()), fmt.Sprint("fired ", firedBefore.Unix()), fmt.Sprint("resolved ", resolved.Unix())}})
	checkAlertsListed(t, page, fired)

	// A week on request: hourly points over 7 days; the alert marks stay where they were. At 1 000
	// px wide, live and evaluation still stand side by side.
	if err := chromedp.Do(bctx,
		chromedp.EmulateViewport(1000, 1000),
		chromedp.Click(chromedp.CSS(`a[data-testid=other-range]`)),
		// The week's page, not the day's still shown: its link offers the day.
		chromedp.WaitVisible(chromedp.CSS(`a[data-testid=other-range][href*="range=24h"]`)),
	); err != nil {
		t.Fatalf("the week's charts: %v", err)
	}
	if err := chromedp.Do(bctx, badgesSettled); err != nil {
		t.Fatalf("the week page's badges did not finish loading: %v", err)
	}
	week, err := chromedp.Run(bctx, chromedp.Evaluate[outcomesPage](readOutcomesJS))
	if err != nil {
		t.Fatalf("read the week's outcomes page: %v", err)
	}
	shot("outcomes-week-1000px.png")
	checkCharts(t, catalog, week, clock, 7*24*time.Hour, true, map[string][]string{
		"fix-solid live": {fmt.Sprint("fired ", fired.Unix()), fmt.Sprint("fired ", firedBefore.Unix()), fmt.Sprint("resolved ", resolved.Unix())}})

	// The suite page, reached by the index's link; it compares the last two versions.
	if err := chromedp.Do(bctx,
		chromedp.Navigate(base+"/"),
		chromedp.Click(chromedp.CSS(`a[href="/ui/suite?workspace=acme&suite=qa"]`)),
		chromedp.WaitVisible(chromedp.CSS(`table[data-testid=moved]`)),
	); err != nil {
		t.Fatalf("suite page: %v", err)
	}
	sp, err := chromedp.Run(bctx, chromedp.Evaluate[suitePage](readSuiteJS))
	if err != nil {
		t.Fatalf("read the suite page: %v", err)
	}
	shot("suite.png")
	checkSuite(t, sp)

	// The badges as the browser draws them: each value's text on its fill at a contrast of at
	// least 4.5:1 (WCAG AA), and no more than a pixel of the badge past its text.
	for _, corr := range []string{"fix-solid", "fix-wide"} {
		badgeURL := base + "/v1/badge.svg?artifact=chat&checkpoint=ckpt-7&correction_id=" + corr + "&model=support-bot&run=prod&workspace=acme"
		if err := chromedp.Do(bctx, chromedp.Navigate(badgeURL), chromedp.WaitReady(chromedp.CSS(`svg`))); err != nil {
			t.Fatalf("badge of %s: %v", corr, err)
		}
		b, err := chromedp.Run(bctx, chromedp.Evaluate[badgeRead](readBadgeJS))
		if err != nil {
			t.Fatalf("read the badge of %s: %v", corr, err)
		}
		if r := contrastRatio(t, b.Text, b.Fill); r < 4.5 {
			t.Errorf("badge of %s: text %s on %s, contrast %.2f, want at least 4.5", corr, b.Text, b.Fill, r)
		}
		if b.Slack < -0.5 || b.Slack > 1.5 || !strings.HasPrefix(b.Title, "R: the repeat rate") {
			t.Errorf("badge of %s: %.1f px past its text (title %q)", corr, b.Slack, b.Title)
		}
		// The width the badge reserves is the text's own within 8 % (Chromium may draw Verdana's
		// metric-compatible stand-in): the text is neither squeezed nor stretched visibly.
		if math.Abs(b.Fitted-b.Natural) > 0.08*b.Natural {
			t.Errorf("badge of %s: text held to %.1f px, drawn on its own at %.1f px", corr, b.Fitted, b.Natural)
		}
	}

	// Another workspace: 403, and nothing of it shown.
	if err := chromedp.Do(bctx, chromedp.Navigate(base+"/ui/suite?workspace=other&suite=qa")); err != nil {
		t.Fatal(err)
	}
	forbidden, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`body`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(forbidden, "may not read the workspace") || strings.Contains(forbidden, "c-flip") {
		t.Errorf("another workspace's page shows:\n%s", forbidden)
	}
	t.Logf("browser test took %v", time.Since(started).Round(time.Millisecond))
}

func concat(parts ...[]kafka.Message) []kafka.Message {
	var out []kafka.Message
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// badgesSettled waits until every correction's badge image has finished loading, or failed to:
// the page is visible before its images arrive, and on a loaded machine the badges were read
// while still loading. Whether each loaded is then checked (checkOutcomes).
var badgesSettled = chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('section[data-correction] h2 img')].every(i => i.complete)`,
	chromedp.WithPollingTimeout(15*time.Second))

// outcomesPage is what readOutcomesJS reads off the rendered outcomes page.
type outcomesPage struct {
	Corrections []struct {
		ID     string           `json:"id"`
		Badge  string           `json:"badge"`
		Img    bool             `json:"img"` // the badge image loaded
		Sides  map[string]*side `json:"sides"`
		Alerts []struct {
			Rule  string  `json:"rule"`
			State string  `json:"state"`
			Text  string  `json:"text"`
			Top   float64 `json:"top"`
		} `json:"alerts"`
	} `json:"corrections"`
}

type side struct {
	Text    string                `json:"text"`
	Chart   bool                  `json:"chart"`
	C       *chartRead            `json:"c"`
	Top     float64               `json:"top"`
	Left    float64               `json:"left"`
	Windows map[string]windowCell `json:"windows"`
}

// chartRead is a time chart as rendered: its scale (data attributes), its lines with the numbers
// they carry and the pixels they were drawn at, its bands, alert marks and axis ticks.
type chartRead struct {
	T0, T1, X0, X1, Y0, Y1, YMax float64
	Width                        float64 `json:"width"`
	Lines                        []struct {
		Series string       `json:"series"`
		T      []int64      `json:"t"`
		Counts []string     `json:"counts"`
		Points [][2]float64 `json:"points"`
	} `json:"lines"`
	Bands []string `json:"bands"`
	Marks []struct {
		Kind string  `json:"kind"`
		T    int64   `json:"t"`
		X    float64 `json:"x"`
	} `json:"marks"`
	YTicks []struct {
		V    float64 `json:"v"`
		Y    float64 `json:"y"`
		Text string  `json:"text"`
	} `json:"yticks"`
	XTicks []struct {
		T    int64   `json:"t"`
		X    float64 `json:"x"`
		Text string  `json:"text"`
	} `json:"xticks"`
	Empty bool `json:"empty"`
}

// windowCell is one window's cell as rendered: its text (white space collapsed) and the interval
// bar's geometry in CSS pixels.
type windowCell struct {
	Text      string  `json:"text"`
	Bar       float64 `json:"bar"`       // width of the whole bar
	CI        float64 `json:"ci"`        // width of the interval drawn in it
	CILeft    float64 `json:"ciLeft"`    // its left edge, from the bar's
	CIFill    string  `json:"ciFill"`    // the interval's computed background-image
	RateColor string  `json:"rateColor"` // the rate's computed colour
	Marker    string  `json:"marker"`    // the text of a visible narrow-result marker
}

const readOutcomesJS = `(() => {
  const norm = s => s.replace(/\s+/g, ' ').trim();
  return {corrections: [...document.querySelectorAll('section[data-testid=correction]')].map(s => {
    const sides = {};
    for (const name of ['live', 'evaluation']) {
      const d = s.querySelector('[data-testid=' + name + ']');
      if (!d) continue;
      const windows = {};
      for (const tr of d.querySelectorAll('tr')) {
        const td = tr.querySelectorAll('td');
        if (td.length < 2) continue;
        const bar = td[1].querySelector('.bar'), ci = td[1].querySelector('.ci');
        const rb = bar ? bar.getBoundingClientRect() : null, rc = ci ? ci.getBoundingClientRect() : null;
        const rate = td[1].querySelector('[data-testid=rate]'), mk = td[1].querySelector('[data-testid=narrow]');
        const shown = e => !!e && e.getBoundingClientRect().width > 0 && getComputedStyle(e).visibility === 'visible';
        windows[norm(td[0].innerText)] = {text: norm(td[1].innerText), bar: rb ? rb.width : 0,
          ci: rc ? rc.width : 0, ciLeft: rc ? rc.left - rb.left : 0,
          ciFill: ci ? getComputedStyle(ci).backgroundImage : '',
          rateColor: rate ? getComputedStyle(rate).color : '', marker: shown(mk) ? norm(mk.innerText) : ''};
      }
      const svg = d.querySelector('svg[data-testid=chart]');
      let chart = null;
      if (svg) {
        const num = (e, k) => parseFloat(e.getAttribute('data-' + k));
        const box = svg.getBoundingClientRect();
        chart = {t0: num(svg, 't0'), t1: num(svg, 't1'), x0: num(svg, 'x0'), x1: num(svg, 'x1'), y0: num(svg, 'y0'), y1: num(svg, 'y1'),
          ymax: num(svg, 'ymax'), width: box.width, left: box.left, right: box.right,
          lines: [...svg.querySelectorAll('polyline[data-testid=line]')].map(l => ({series: l.dataset.series,
            t: l.dataset.t.split(' ').map(Number), counts: l.dataset.counts.split(' '),
            points: [...l.points].map(p => [p.x, p.y])})),
          bands: [...svg.querySelectorAll('polygon[data-testid=band]')].map(b => b.dataset.series),
          marks: [...svg.querySelectorAll('g[data-testid^=alert-]')].map(g => ({kind: g.dataset.testid.slice(6), t: Number(g.dataset.t),
            x: g.querySelector('line').x1.baseVal.value})),
          yticks: [...svg.querySelectorAll('[data-testid=y-tick]')].map(e => ({v: num(e, 'value'), y: e.y.baseVal[0].value - 3.5, text: e.textContent})),
          xticks: [...svg.querySelectorAll('[data-testid=x-tick]')].map(e => ({t: num(e, 't'), x: e.x.baseVal[0].value, text: e.textContent})),
          empty: !!svg.querySelector('[data-testid=chart-empty]')};
      }
      const box = d.getBoundingClientRect();
      sides[name] = {text: norm(d.innerText), chart: !!chart, c: chart, top: box.top, left: box.left, windows};
    }
    const img = s.querySelector('h2 img');
    const alerts = [...s.querySelectorAll('[data-testid=alert]')].map(li => ({rule: li.dataset.rule, state: li.dataset.state,
      text: norm(li.innerText), top: li.getBoundingClientRect().top}));
    return {id: s.dataset.correction, badge: norm(s.querySelector('[data-testid=badge]').innerText),
      img: !!img && img.complete && img.naturalWidth > 0, sides, alerts};
  })};
})()`

func checkOutcomes(t *testing.T, p outcomesPage) {
	t.Helper()
	if len(p.Corrections) != 2 || p.Corrections[0].ID != "fix-solid" || p.Corrections[1].ID != "fix-wide" {
		t.Fatalf("corrections shown: %+v, want fix-solid and fix-wide", p.Corrections)
	}
	// Each window's cell: rate, [95 % interval], confirmed/scored, unscored (docs/semantics.md#wilson).
	want := map[string]map[string]map[string]string{
		"fix-solid": {
			"live": {
				"all": "2.5% [1.4%–4.5%] 10/400 +0 unscored",
				"24h": "2.5% [1.4%–4.5%] 10/400 +0 unscored",
				"7d":  "2.5% [1.4%–4.5%] 10/400 +0 unscored",
				"1h":  "3.0% [1.4%–6.4%] 6/200 +0 unscored",
			},
			"evaluation": {
				"all": "10.0% [3.5%–25.6%] 3/30 wide interval +0 unscored",
				"1h":  "10.0% [3.5%–25.6%] 3/30 wide interval +0 unscored",
			},
		},
		"fix-wide": {
			"live": {
				"all": "25.0% [4.6%–69.9%] 1/4 few scored +1 unscored",
				"1h":  "25.0% [4.6%–69.9%] 1/4 few scored +1 unscored",
			},
			"evaluation": {
				"all": "not measured +2 unscored",
				"24h": "not measured +2 unscored",
			},
		},
	}
	badges := map[string]string{"fix-solid": "2.5% live (10/400, 0 unscored)", "fix-wide": "25.0% live (1/4, 1 unscored)"}
	for _, c := range p.Corrections {
		if c.Badge != badges[c.ID] || !c.Img {
			t.Errorf("%s: badge %q (image loaded %v), want %q", c.ID, c.Badge, c.Img, badges[c.ID])
		}
		for src, windows := range want[c.ID] {
			s := c.Sides[src]
			if s == nil {
				t.Errorf("%s: no %s side", c.ID, src)
				continue
			}
			if !s.Chart {
				t.Errorf("%s %s: no time chart", c.ID, src)
			}
			for win, text := range windows {
				if got := s.Windows[win].Text; got != text {
					t.Errorf("%s %s %s: shows %q, want %q", c.ID, src, win, got, text)
				}
			}
			for win, cell := range s.Windows {
				checkNarrow(t, c.ID+" "+src+" "+win, cell)
			}
			if !strings.Contains(s.Text, "opportunities 20") || !strings.Contains(s.Text, "observed ") {
				t.Errorf("%s %s: no opportunity window or observation time: %q", c.ID, src, s.Text)
			}
		}
	}
}

// intervalText finds a cell's "[4.6%–69.9%]".
var intervalText = regexp.MustCompile(`\[([0-9.]+)%–([0-9.]+)%\]`)

// checkNarrow: narrow results look narrow. Every measured window draws its 95 % interval across
// the bar in proportion (0 % at the left edge, 100 % at the right); one with few scored (under 20)
// or a wide interval (20 points or more) carries a visible marker saying which, a hatched interval
// and a muted rate, while a precise one has none of these.
func checkNarrow(t *testing.T, where string, c windowCell) {
	t.Helper()
	m := intervalText.FindStringSubmatch(c.Text)
	if m == nil { // not measured: no bar, no marker
		if c.Bar != 0 || c.Marker != "" {
			t.Errorf("%s: unmeasured window draws a bar (%v px) or marker %q", where, c.Bar, c.Marker)
		}
		return
	}
	lo, _ := strconv.ParseFloat(m[1], 64)
	hi, _ := strconv.ParseFloat(m[2], 64)
	lo, hi = lo/100, hi/100
	if c.Bar < 100 || math.Abs(c.CILeft-lo*c.Bar) > 1 || math.Abs(c.CI-max(1, (hi-lo)*c.Bar)) > 1 {
		t.Errorf("%s: interval [%.3f, %.3f] drawn at %.1f px, %.1f px wide, in a %.1f px bar; want %.1f and %.1f",
			where, lo, hi, c.CILeft, c.CI, c.Bar, lo*c.Bar, (hi-lo)*c.Bar)
	}
	n, _ := strconv.Atoi(strings.Split(strings.Fields(c.Text[strings.Index(c.Text, "]")+1:])[0], "/")[1])
	want := ""
	switch {
	case n < 20:
		want = "few scored"
	case hi-lo >= 0.20-0.001: // the shown bounds are rounded to 0.1 %
		want = "wide interval"
	}
	if c.Marker != want {
		t.Errorf("%s: marker %q, want %q (%d scored, interval %.1f points)", where, c.Marker, want, n, 100*(hi-lo))
	}
	hatched := strings.Contains(c.CIFill, "repeating-linear-gradient")
	// The rate's colour: the page's text colour (#222) when precise, a light grey when not.
	muted := lightness(t, c.RateColor) >= 0x99
	if hatched != (want != "") || muted != (want != "") {
		t.Errorf("%s: interval hatched %v and rate muted %v (%s), want both %v", where, hatched, muted, c.RateColor, want != "")
	}
}

// lightness is the mean channel of a computed colour "rgb(r, g, b)".
func lightness(t *testing.T, rgb string) int {
	var r, g, b int
	if _, err := fmt.Sscanf(rgb, "rgb(%d, %d, %d)", &r, &g, &b); err != nil {
		t.Errorf("colour %q: %v", rgb, err)
	}
	return (r + g + b) / 3
}

// suitePage is what readSuiteJS reads off the rendered suite page: every data-testid's text, the
// stability rows and the moved cases.
type suitePage struct {
	Fields    map[string]string `json:"fields"`
	Stability [][]string        `json:"stability"`
	Moved     [][]string        `json:"moved"`
	Cases     [][]string        `json:"cases"`
	Text      string            `json:"text"`
	Chart     *struct {
		Y0, Y1, Floor, Ceiling, FloorY, CeilingY float64
		Means                                    []struct {
			Version string
			Mean    float64
			Y       float64
		}
	} `json:"chart"`
}

const readSuiteJS = `(() => {
  const norm = s => s.replace(/\s+/g, ' ').trim();
  const rows = sel => [...document.querySelectorAll(sel + ' tr')].slice(1).map(tr => [...tr.children].map(td => norm(td.innerText)));
  const fields = {};
  for (const e of document.querySelectorAll("[data-testid]")) fields[e.dataset.testid] = norm(e.innerText ?? e.textContent);
  const svg = document.querySelector('svg[data-testid=suite-chart]');
  let chart = null;
  if (svg) {
    const band = svg.querySelector('[data-testid=achievable]');
    const y = sel => { const e = svg.querySelector(sel); return e ? e.y1.baseVal.value : -1; };
    chart = {y0: parseFloat(svg.dataset.y0), y1: parseFloat(svg.dataset.y1),
      floor: band ? parseFloat(band.dataset.floor) : -1, ceiling: band ? parseFloat(band.dataset.ceiling) : -1,
      floorY: y('[data-testid=floor-line]'), ceilingY: y('[data-testid=ceiling-line]'),
      means: [...svg.querySelectorAll('[data-testid=version-rate]')].map(c => ({version: c.dataset.version, mean: parseFloat(c.dataset.rate), y: c.cy.baseVal.value}))};
  }
  return {fields, stability: rows('table[data-testid=stability]'), moved: rows('table[data-testid=moved]'),
    cases: rows('table[data-testid=cases]'), text: norm(document.body.innerText), chart};
})()`

func checkSuite(t *testing.T, p suitePage) {
	t.Helper()
	// Judged cases: c-pass, c-fail, c-flip, c-fixed (c-gone and c-new have fewer than 3 outcomes).
	// floor 1/4, ceiling 3/4, range 2/4; latest (v3) pass rate over judged: c-pass and c-fixed of 4.
	for k, v := range map[string]string{"always_pass": "1", "always_fail": "1", "discriminating": "2", "too_new": "2",
		"floor": "0.250", "ceiling": "0.750", "range": "0.500", "latest": "0.500",
		"common": "4", "fixed": "1", "regressed": "1", "tier-report": "3", "tier-nightly": "1", "tier-unchanged": "2"} {
		if p.Fields[k] != v {
			t.Errorf("suite page %s = %q, want %q", k, p.Fields[k], v)
		}
	}
	// v2 → v3: pass rate 3/5 → 3/5 over every case, 2/4 → 2/4 over the 4 in both.
	if got, want := p.Fields["moved-summary"], "v2 → v3: pass rate 0.600 → 0.600; over the 4 cases in both: 1 fixed, 1 regressed (0.500 → 0.500); 1 only in v2, 1 only in v3"; got != want {
		t.Errorf("moved summary:\n got %q\nwant %q", got, want)
	}
	moved := fmt.Sprint(p.Moved)
	if want := "[[c-fixed fail pass fixed 0.2500] [c-flip pass fail regressed -0.2500]]"; moved != want {
		t.Errorf("moved cases %s, want %s", moved, want)
	}
	// v3: runs 2, cases 5; run 0 passes 4 of 5, run 1 3 of 5: mean 0.7, sd 0.141, min–max 0.6–0.8;
	// pass@1 = (1+0+½+1+1)/5, pass@2 = 4/5, G-Pass@2 at τ=1 = 3/5; no abnormal, no missing run.
	var v3 []string
	for _, r := range p.Stability {
		if len(r) > 0 && r[0] == "v3" {
			v3 = r
		}
	}
	if got, want := strings.Join(v3, " | "), "v3 | 2 | 5 | 0.700 | 0.141 | 0.600–0.800 | 0.700 | 0.700 | 0.800 | 0.600 | 0 | 0"; got != want {
		t.Errorf("stability of v3:\n got %s\nwant %s", got, want)
	}
	if len(p.Stability) != 3 {
		t.Errorf("stability rows %v, want v1–v3", p.Stability)
	}
	// The chart: the achievable range between floor and ceiling, each version's mean at its height.
	if c := p.Chart; c == nil {
		t.Error("the suite page draws no chart")
	} else {
		yOf := func(r float64) float64 { return c.Y0 + r*(c.Y1-c.Y0) }
		if c.Floor != 0.25 || c.Ceiling != 0.75 || math.Abs(c.FloorY-yOf(0.25)) > 0.2 || math.Abs(c.CeilingY-yOf(0.75)) > 0.2 {
			t.Errorf("suite chart: achievable range %+v, want floor 0.25 and ceiling 0.75 at their heights", c)
		}
		var means []string
		for _, m := range c.Means {
			means = append(means, fmt.Sprintf("%s %.3f", m.Version, m.Mean))
			if math.Abs(m.Y-yOf(m.Mean)) > 0.2 {
				t.Errorf("suite chart: %s's mean %.3f drawn at %.1f, want %.1f", m.Version, m.Mean, m.Y, yOf(m.Mean))
			}
		}
		// Each version's pass rate over the judged cases (c-pass, c-fail, c-flip, c-fixed; a case
		// passes a version when all its runs pass): 2 of 4 in v1, v2 and v3 — v3's is the page's
		// "latest pass rate", and none lies outside floor to ceiling.
		if want := "[v1 0.500 v2 0.500 v3 0.500]"; fmt.Sprint(means) != want || p.Fields["latest"] != "0.500" {
			t.Errorf("suite chart's pass rates %v, want %s (the latest one as the page's %q)", means, want, p.Fields["latest"])
		}
		for _, m := range c.Means {
			if m.Mean < c.Floor || m.Mean > c.Ceiling {
				t.Errorf("suite chart: %s's pass rate %.3f outside the achievable range %.3f–%.3f", m.Version, m.Mean, c.Floor, c.Ceiling)
			}
		}
	}
	for _, class := range []string{"always_pass", "always_fail", "discriminating", "too_new", "none", "revived"} {
		if !strings.Contains(p.Fields["legend"], class) {
			t.Errorf("the legend does not explain %q: %q", class, p.Fields["legend"])
		}
	}
	tiers := map[string]string{}
	for _, r := range p.Cases {
		if len(r) >= 3 {
			tiers[r[0]] = r[1] + " " + r[2]
		}
	}
	for c, want := range map[string]string{"c-pass": "always_pass nightly", "c-fail": "always_fail report", "c-flip": "discriminating report",
		"c-fixed": "discriminating report", "c-gone": "too_new unchanged", "c-new": "too_new unchanged"} {
		if tiers[c] != want {
			t.Errorf("case %s: class and tier %q, want %q", c, tiers[c], want)
		}
	}
}

// badgeRead is a badge's value part as Chromium draws it: the computed fills of its text and of
// the rectangle behind it, the pixels of the badge past the end of its text, and its title.
type badgeRead struct {
	Text, Fill, Title string
	Slack             float64
	// Fitted is the width the badge holds its value's text to (textLength), Natural the width
	// the browser draws that text at on its own.
	Fitted, Natural float64
}

const readBadgeJS = `(() => {
  const svg = document.querySelector('svg'), rects = svg.querySelectorAll('rect'), texts = svg.querySelectorAll('text');
  const value = texts[texts.length - 1], t = value.getBBox();
  const natural = value.cloneNode(true);
  natural.removeAttribute('textLength');
  natural.removeAttribute('lengthAdjust');
  value.parentNode.appendChild(natural);
  return {text: getComputedStyle(value).fill, fill: getComputedStyle(rects[rects.length - 1]).fill,
    slack: svg.width.baseVal.value - (t.x + t.width) - 5, title: (svg.querySelector('title') || {}).textContent || '',
    fitted: parseFloat(value.getAttribute('textLength')), natural: natural.getComputedTextLength()};
})()`

// contrastRatio is the WCAG 2 contrast of two computed colours "rgb(r, g, b)".
func contrastRatio(t *testing.T, a, b string) float64 {
	lum := func(c string) float64 {
		var r, g, bl float64
		if _, err := fmt.Sscanf(c, "rgb(%g, %g, %g)", &r, &g, &bl); err != nil {
			t.Errorf("colour %q: %v", c, err)
		}
		lin := func(v float64) float64 {
			v /= 255
			if v <= 0.03928 {
				return v / 12.92
			}
			return math.Pow((v+0.055)/1.055, 2.4)
		}
		return 0.2126*lin(r) + 0.7152*lin(g) + 0.0722*lin(bl)
	}
	la, lb := lum(a), lum(b)
	return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)
}
