package aggregator

import (
	"math"

	"github.com/repeatrate/repeatrate/schemas"
)

// z95 is the two-sided 95 % standard normal quantile of the Wilson interval (docs/semantics.md#wilson).
const z95 = 1.959964

// Wilson returns the 95 % Wilson score interval of c successes in n trials. n must be positive.
func Wilson(c, n int64) schemas.Interval {
	p := float64(c) / float64(n)
	nf := float64(n)
	z2 := z95 * z95
	den := 1 + z2/nf
	centre := (p + z2/(2*nf)) / den
	half := z95 * math.Sqrt(p*(1-p)/nf+z2/(4*nf*nf)) / den
	return schemas.Interval{Low: math.Max(0, centre-half), High: math.Min(1, centre+half)}
}

// Counts are the opportunities of one window by class.
type Counts struct {
	Confirmed, Passed, Unscored int64
}

// Window turns counts into the published window: rate, percentage and interval when anything was
// scored, not_measured otherwise.
func (c Counts) Window() schemas.Window {
	w := schemas.Window{
		ConfirmedRepeats: c.Confirmed, Passed: c.Passed, Unscored: c.Unscored,
		Scored: c.Confirmed + c.Passed, Status: schemas.StatusNotMeasured,
	}
	if w.Scored > 0 {
		rate := float64(c.Confirmed) / float64(w.Scored)
		pct := 100 * rate
		ci := Wilson(c.Confirmed, w.Scored)
		w.Rate, w.Percentage, w.CI95, w.Status = &rate, &pct, &ci, schemas.StatusMeasured
	}
	return w
}

func (c *Counts) add(cl Class, d int64) {
	switch cl {
	case Confirmed:
		c.Confirmed += d
	case Passed:
		c.Passed += d
	case Unscored:
		c.Unscored += d
	}
}
