package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
)

// progressEvery is the least time between two refreshes of a progress line: at most 4 a second.
const progressEvery = 250 * time.Millisecond

// progress shows how far a long run is, on one line of a terminal rewritten in place: events done,
// their rate, and, when the total amount of work is known, the share done and the time left. Work
// is counted in its own units (bytes of input, offsets of a topic); events are what the run
// handled. Off a terminal it writes nothing at all, so piped and logged output stays clean. It is
// not safe for concurrent use.
type progress struct {
	w     io.Writer
	now   func() time.Time
	on    bool   // w is a terminal
	label string // the command, first on the line
	total int64  // units of work in all; 0: unknown

	start, last  time.Time // the start; the last refresh
	events, done int64
	width        int // length of the line on screen, blanked past the new one
}

// newProgress returns a progress line on w, shown only if w is a terminal.
func newProgress(w io.Writer, label string, total int64) *progress {
	f, ok := w.(*os.File)
	return newProgressWith(w, time.Now, ok && term.IsTerminal(int(f.Fd())), label, total)
}

// newProgressWith returns a progress line on w with its clock and whether w is a terminal given.
func newProgressWith(w io.Writer, now func() time.Time, terminal bool, label string, total int64) *progress {
	p := &progress{w: w, now: now, on: terminal, label: label, total: total}
	if terminal {
		p.start = now()
		p.last = p.start
	}
	return p
}

// set records events and units of work done so far and refreshes the line if the last refresh is
// progressEvery old. The first line appears progressEvery after the start: a short run shows none.
func (p *progress) set(events, done int64) {
	if !p.on {
		return
	}
	p.events, p.done = events, done
	if t := p.now(); t.Sub(p.last) >= progressEvery {
		p.last = t
		p.draw(p.line(t, false), false)
	}
}

// finish replaces the line with the run's totals and ends it, if a line was shown; off a terminal
// and after a short run it writes nothing.
func (p *progress) finish() {
	if !p.on || p.width == 0 {
		return
	}
	p.draw(p.line(p.now(), true), true)
	p.width = 0
}

// line renders the progress at t.
func (p *progress) line(t time.Time, final bool) string {
	el := t.Sub(p.start)
	rate := 0.0
	if el > 0 {
		rate = float64(p.events) / el.Seconds()
	}
	if final {
		return fmt.Sprintf("%s: %d events in %s, %.0f/s", p.label, p.events, el.Round(time.Second), rate)
	}
	s := fmt.Sprintf("%s: %d events, %.0f/s", p.label, p.events, rate)
	if p.total > 0 {
		done := min(p.done, p.total)
		s += fmt.Sprintf(", %d%%", done*100/p.total)
		if done > 0 {
			left := time.Duration(float64(el) * float64(p.total-done) / float64(done))
			s += fmt.Sprintf(", %s left", left.Round(time.Second))
		}
	}
	return s
}

// draw writes s over the line on screen: a carriage return, s, and blanks over the rest of a
// longer previous line (no escape sequences, so any terminal shows it right).
func (p *progress) draw(s string, end bool) {
	pad := max(0, p.width-len(s))
	p.width = len(s)
	tail := ""
	if end {
		tail = "\n"
	}
	fmt.Fprintf(p.w, "\r%s%s%s", s, strings.Repeat(" ", pad), tail)
}

// reader counts what is read through r as progress: bytes as units of work, lines as events
// (a line is an event to the commands that read NDJSON). Off a terminal it returns r itself.
func (p *progress) reader(r io.Reader) io.Reader {
	if !p.on {
		return r
	}
	return &progressReader{r: r, p: p}
}

type progressReader struct {
	r            io.Reader
	p            *progress
	bytes, lines int64
}

func (r *progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.bytes += int64(n)
	r.lines += int64(bytes.Count(b[:n], []byte{'\n'}))
	r.p.set(r.lines, r.bytes)
	return n, err
}

// inputSize is the size of r if it is a regular file, else 0 (unknown).
func inputSize(r io.Reader) int64 {
	f, ok := r.(*os.File)
	if !ok {
		return 0
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return 0
	}
	return fi.Size()
}
