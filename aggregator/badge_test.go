package aggregator

import (
	"testing"

	"github.com/repeatrate/repeatrate/schemas"
)

func TestRateColour(t *testing.T) {
	for _, c := range []struct {
		confirmed, scored int64
		want              Colour
	}{
		{0, 0, LightGrey},        // nothing scored: no rate
		{0, 1, BrightGreen},      // 0 %
		{0, 100000, BrightGreen}, // 0 % of many
		{1, 100000, Green},       // 0.001 %, shown "0.0%": a repeat is never brightgreen
		{1, 21, Green},           // 4.76 %, shown "4.8%"
		{4999, 100000, Green},    // 4.999 %, shown "5.0%": the band follows the exact rate
		{1, 20, YellowGreen},     // 5 %: the bound belongs to the band above
		{9, 100, YellowGreen},    // 9 %
		{1, 10, Yellow},          // 10 %
		{19, 100, Yellow},        // 19 %
		{1, 5, Orange},           // 20 %, the seed example 4/20
		{1, 4, Orange},           // 25 %
		{349, 1000, Orange},      // 34.9 %
		{7, 20, Red},             // 35 %
		{1, 1, Red},              // 100 %
	} {
		if got := RateColour(c.confirmed, c.scored); got != c.want {
			t.Errorf("RateColour(%d, %d) = %s, want %s", c.confirmed, c.scored, got, c.want)
		}
	}
}

func TestChooseBadgeColour(t *testing.T) {
	measured := func(c, p, u int64) schemas.Window { return Counts{c, p, u}.Window() }
	for _, c := range []struct {
		name       string
		live, eval schemas.Window
		want       Colour
	}{
		// Live is measured: its band, whatever evaluation says.
		{"live", measured(0, 10, 0), measured(10, 0, 0), BrightGreen},
		// Only evaluation is measured: its band.
		{"evaluation", measured(0, 0, 4), measured(4, 16, 3), Orange},
		// Nothing scored anywhere: grey.
		{"not measured", measured(0, 0, 2), measured(0, 0, 0), LightGrey},
	} {
		if b := ChooseBadge(c.live, c.eval); b.Colour != c.want {
			t.Errorf("%s: colour %s (%s), want %s", c.name, b.Colour, b.Value, c.want)
		}
	}
}

func TestColourHex(t *testing.T) {
	seen := map[string]Colour{}
	for _, c := range []Colour{BrightGreen, Green, YellowGreen, Yellow, Orange, Red, LightGrey} {
		h := c.Hex()
		if prev, dup := seen[h]; dup {
			t.Errorf("%s and %s share fill %s", prev, c, h)
		}
		seen[h] = c
	}
	if Colour("mauve").Hex() != LightGrey.Hex() {
		t.Errorf("an unknown colour is not grey")
	}
}
