package readside

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// alertView is an alert as a page lists it: its record and its evidence in words.
type alertView struct {
	CurrentAlert
	Evidence string
}

// windowWords names an evidence window for a reader: "1h" is the last hour, "24h-1h" (a
// baseline: the longer window less the recent one) the 23 hours before it.
func windowWords(name string) string {
	long, short, baseline := strings.Cut(name, "-")
	if baseline {
		if long == "all" && windowLength(short) > 0 {
			return "all before the " + strings.TrimPrefix(windowWords(short), "last ")
		}
		d := windowLength(long) - windowLength(short)
		if d <= 0 {
			return name
		}
		return "the " + spanWords(d) + " before"
	}
	switch name {
	case "all":
		return "all time"
	case "1h":
		return "last hour"
	}
	if d := windowLength(name); d > 0 {
		return "last " + spanWords(d)
	}
	return name
}

func windowLength(name string) time.Duration {
	switch name {
	case "1h":
		return time.Hour
	case "24h":
		return 24 * time.Hour
	case "7d":
		return 7 * 24 * time.Hour
	}
	return 0
}

// spanWords says a whole number of hours as hours, or days when it is whole days above a day.
func spanWords(d time.Duration) string {
	h := int64(d / time.Hour)
	if h > 24 && h%24 == 0 {
		return strconv.FormatInt(h/24, 10) + " days"
	}
	if h == 1 {
		return "hour"
	}
	return strconv.FormatInt(h, 10) + " h"
}

// thousands writes n with a thin space between groups of three digits: 9 275.
func thousands(n int64) string {
	if n < 0 {
		return "-" + groupDigits(strconv.FormatUint(uint64(-(n+1))+1, 10))
	}
	return groupDigits(strconv.FormatInt(n, 10))
}

func groupDigits(s string) string {
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteString("\u2009")
		}
		b.WriteRune(c)
	}
	return b.String()
}

func windowRate(w schemas.AlertWindow) string {
	if w.Rate == nil || w.Scored == 0 {
		return "nothing scored in " + windowWords(w.Name)
	}
	return fmt.Sprintf("%s %.1f%% of %s scored", windowWords(w.Name), *w.Rate*100, thousands(w.Scored))
}

// evidenceWords says what a rule of kind saw when its alert fired, in one line: "last hour 13.4%
// of 9 275 scored vs the 23 h before 2.0% of 3 000 scored; the increase is at least 8.1 points at
// the test's confidence". Empty without evidence.
func evidenceWords(kind string, ev *schemas.AlertEvidence) string {
	if ev == nil {
		return ""
	}
	switch {
	case kind == "change" && len(ev.Windows) == 2 && ev.Test != nil && ev.Test.Detector != nil:
		d := ev.Test.Detector
		return fmt.Sprintf("%s vs %s; the detector's evidence e^%.1f reached its threshold e^%.1f over %s outcomes against a baseline bound of %.1f%%",
			windowRate(ev.Windows[0]), windowRate(ev.Windows[1]), d.Statistic, d.Threshold, thousands(d.Scored), d.BaselineHigh*100)
	case kind == "change" && len(ev.Windows) == 2 && ev.Test != nil:
		return fmt.Sprintf("%s vs %s; the increase is at least %.1f points at the test's confidence",
			windowRate(ev.Windows[0]), windowRate(ev.Windows[1]), ev.Test.LowerDifference*100)
	case kind == "not_measured_for" && ev.Value != nil:
		return "no scored opportunity for " + durationWords(time.Duration(*ev.Value*float64(time.Second)))
	case kind == "threshold" && len(ev.Windows) == 1 && ev.Threshold != nil:
		return fmt.Sprintf("%s; threshold %.1f%%", windowRate(ev.Windows[0]), *ev.Threshold*100)
	case ev.Value != nil && ev.Threshold != nil:
		return fmt.Sprintf("value %s; threshold %s", strconv.FormatFloat(*ev.Value, 'g', 4, 64), strconv.FormatFloat(*ev.Threshold, 'g', 4, 64))
	}
	return ""
}

// durationWords says a duration to the minute: "45 min", "2 h", "2 h 5 min", "3 days 4 h".
func durationWords(d time.Duration) string {
	m := int64(d.Round(time.Minute) / time.Minute)
	days, h, min := m/(24*60), m/60%24, m%60
	var parts []string
	if days > 0 {
		parts = append(parts, strconv.FormatInt(days, 10)+map[bool]string{true: " day", false: " days"}[days == 1])
	}
	if h > 0 {
		parts = append(parts, strconv.FormatInt(h, 10)+" h")
	}
	if min > 0 || len(parts) == 0 {
		parts = append(parts, strconv.FormatInt(min, 10)+" min")
	}
	return strings.Join(parts, " ")
}
