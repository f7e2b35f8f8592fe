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
}

// ChooseBadge picks the badge from the all-time windows of the two sources.
func ChooseBadge(live, eval schemas.Window) Badge {
	for _, c := range []struct {
		src string
		w   schemas.Window
	}{{"live", live}, {"evaluation", eval}} {
		if c.w.Status == schemas.StatusMeasured {
			return Badge{Source: c.src, Measured: true, Value: fmt.Sprintf("%.1f%% %s (%d/%d, %d unscored)",
				*c.w.Percentage, c.src, c.w.ConfirmedRepeats, c.w.Scored, c.w.Unscored)}
		}
	}
	return Badge{Value: fmt.Sprintf("not measured (live %d unscored, evaluation %d unscored)", live.Unscored, eval.Unscored)}
}
