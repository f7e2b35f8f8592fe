package aggregator

import (
	"fmt"

	"github.com/repeatrate/repeatrate/schemas"
)

// Badge is the compact R badge of one scope and correction (docs/semantics.md#badge): the live all-time rate when
// live is measured, else the evaluation rate when that is measured, else "not measured". It always
// names its source and counts, so a tiny population is visible at a glance.
type Badge struct {
	Source   string // "live", "evaluation", or "" when neither is measured
	Measured bool
	Value    string // the right half of the badge, e.g. "20.0% live (4/20, 3 unscored)"
	Colour   Colour // the rate's band (RateColour), LightGrey when not measured
}

// Colour is a badge colour, named as shields.io names it.
type Colour string

// The badge colours: the rate bands from best to worst, and grey for no rate.
const (
	BrightGreen Colour = "brightgreen"
	Green       Colour = "green"
	YellowGreen Colour = "yellowgreen"
	Yellow      Colour = "yellow"
	Orange      Colour = "orange"
	Red         Colour = "red"
	LightGrey   Colour = "lightgrey"
)

// Hex returns the colour's fill as shields.io draws it; an unknown colour is grey.
func (c Colour) Hex() string {
	switch c {
	case BrightGreen:
		return "#4c1"
	case Green:
		return "#97ca00"
	case YellowGreen:
		return "#a4a61d"
	case Yellow:
		return "#dfb317"
	case Orange:
		return "#fe7d37"
	case Red:
		return "#e05d44"
	}
	return "#9f9f9f"
}

// rateBands are the upper bounds (exclusive, in percent) of the bands above brightgreen, which
// is exactly 0 %; a rate of 35 % or more is red. A lower repeat rate is better.
var rateBands = [...]struct {
	below  int64
	colour Colour
}{{5, Green}, {10, YellowGreen}, {20, Yellow}, {35, Orange}}

// RateColour returns the band of a rate of confirmed repeats out of scored opportunities, LightGrey
// when none is scored (docs/semantics.md#badge). It compares the exact fraction, not the rounded percentage the badge
// shows: 1 of 21 (4.76 %, shown "4.8%") is green, 1 of 20 (5 %) yellowgreen, and a single repeat
// in any number of opportunities is never brightgreen.
func RateColour(confirmed, scored int64) Colour {
	switch {
	case scored <= 0:
		return LightGrey
	case confirmed <= 0:
		return BrightGreen
	}
	for _, b := range rateBands {
		if confirmed*100 < b.below*scored {
			return b.colour
		}
	}
	return Red
}

// ChooseBadge picks the badge from the all-time windows of the two sources.
func ChooseBadge(live, eval schemas.Window) Badge {
	for _, c := range []struct {
		src string
		w   schemas.Window
	}{{"live", live}, {"evaluation", eval}} {
		if c.w.Status == schemas.StatusMeasured {
			return Badge{Source: c.src, Measured: true, Colour: RateColour(c.w.ConfirmedRepeats, c.w.Scored),
				Value: fmt.Sprintf("%.1f%% %s (%d/%d, %d unscored)",
					*c.w.Percentage, c.src, c.w.ConfirmedRepeats, c.w.Scored, c.w.Unscored)}
		}
	}
	return Badge{Colour: LightGrey,
		Value: fmt.Sprintf("not measured (live %d unscored, evaluation %d unscored)", live.Unscored, eval.Unscored)}
}
