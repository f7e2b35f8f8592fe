package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestProgressLines(t *testing.T) {
	const ms = time.Millisecond
	type step struct {
		at           time.Duration // since the start
		events, done int64
	}
	for _, tc := range []struct {
		name     string
		terminal bool
		total    int64
		steps    []step
		end      step // the last set, then finish
		want     string
	}{
		// Known total: share done and time left; refreshed in place, at most every 250 ms, a
		// shorter line blanks the rest of the longer one; the totals end the line.
		{"known total", true, 1000, []step{{100 * ms, 100, 10}, {time.Second, 1000, 250}, {1100 * ms, 1100, 300},
			{2 * time.Second, 1500, 500}}, step{2100 * ms, 2000, 1000},
			"\rreplay: 1000 events, 1000/s, 25%, 3s left" +
				"\rreplay: 1500 events, 750/s, 50%, 2s left " +
				"\rreplay: 2000 events in 2s, 952/s        \n"},
		// Unknown total (standard input from a pipe): events and rate only.
		{"unknown total", true, 0, []step{{300 * ms, 30, 3000}, {90 * time.Second, 9000, 9e6}}, step{100 * time.Second, 10000, 1e7},
			"\rreplay: 30 events, 100/s" + "\rreplay: 9000 events, 100/s" + "\rreplay: 10000 events, 100/s" +
				"\rreplay: 10000 events in 1m40s, 100/s\n"},
		// Nothing done yet: no time left to estimate; more done than the total (a growing file)
		// shows 100%, never more.
		{"edges", true, 100, []step{{250 * ms, 0, 0}}, step{500 * ms, 7, 150},
			"\rreplay: 0 events, 0/s, 0%" + "\rreplay: 7 events, 14/s, 100%, 0s left" + "\rreplay: 7 events in 1s, 14/s         \n"},
		// A run shorter than one refresh shows nothing, not even its totals.
		{"short run", true, 1000, []step{{100 * ms, 10, 10}}, step{200 * ms, 1000, 1000}, ""},
		// Not a terminal: nothing at all, however long the run.
		{"not a terminal", false, 1000, []step{{time.Second, 10, 10}, {time.Minute, 20, 20}}, step{time.Hour, 30, 30}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
			clock := &fakeClock{start}
			var out bytes.Buffer
			p := newProgressWith(&out, clock.now, tc.terminal, "replay", tc.total)
			for _, s := range append(tc.steps, tc.end) {
				clock.t = start.Add(s.at)
				p.set(s.events, s.done)
			}
			p.finish()
			p.finish() // a second finish writes nothing more
			if got := out.String(); got != tc.want {
				t.Fatalf("output:\n%q\nwant:\n%q", got, tc.want)
			}
		})
	}
}

func TestProgressReader(t *testing.T) {
	input := strings.Repeat(`{"specversion":"1.0"}`+"\n", 40) // 40 lines of 22 bytes
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := &fakeClock{start}
	var out bytes.Buffer
	p := newProgressWith(&out, clock.now, true, "produce", int64(len(input)))
	r := p.reader(&slowReader{r: strings.NewReader(input), n: 220, clock: clock, step: time.Second})
	var got []byte
	buf := make([]byte, 220)
	for {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if string(got) != input {
		t.Fatalf("read %q", got)
	}
	p.finish()
	// Each read is 10 lines (220 bytes) a second later.
	want := "\rproduce: 10 events, 10/s, 25%, 3s left" + "\rproduce: 20 events, 10/s, 50%, 2s left" +
		"\rproduce: 30 events, 10/s, 75%, 1s left" + "\rproduce: 40 events, 10/s, 100%, 0s left" +
		"\rproduce: 40 events, 8/s, 100%, 0s left " + // the read that finds the end
		"\rproduce: 40 events in 5s, 8/s         \n"
	if got := out.String(); got != want {
		t.Fatalf("output:\n%q\nwant:\n%q", got, want)
	}
}

func TestProgressQuietOffTerminal(t *testing.T) {
	// What the commands build: a buffer is no terminal, so nothing is written, and the input
	// is read as it is.
	var out bytes.Buffer
	p := newProgress(&out, "replay", 100)
	in := strings.NewReader("a\nb\n")
	if r := p.reader(in); r != io.Reader(in) {
		t.Fatalf("reader wrapped off a terminal: %T", r)
	}
	p.set(10, 10)
	p.finish()
	if out.Len() != 0 {
		t.Fatalf("wrote %q off a terminal", out.String())
	}
	if n := inputSize(in); n != 0 {
		t.Fatalf("inputSize of a strings.Reader = %d, want 0 (unknown)", n)
	}
}

// slowReader reads at most n bytes a call, each call moving the clock by step.
type slowReader struct {
	r     io.Reader
	n     int
	clock *fakeClock
	step  time.Duration
}

func (s *slowReader) Read(b []byte) (int, error) {
	s.clock.t = s.clock.t.Add(s.step)
	return s.r.Read(b[:min(len(b), s.n)])
}
