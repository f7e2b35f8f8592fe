package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/consumer"
)

// The batch linger's default is stated in three places that must agree: the processor's
// configuration (what `repeatrate run` and `repeatrate dev` start from), the consumer group's own
// default (what a GroupConfig left at zero gets) and the README's configuration table. Commit
// d62daed moved it from 50 ms to 20 ms in all three; a later change of one alone fails here.
func TestLingerDefaultsAgree(t *testing.T) {
	const want = 20 * time.Millisecond
	if got := defaultConfig().Batch.Linger; got != want {
		t.Errorf("defaultConfig().Batch.Linger = %v, want %v", got, want)
	}
	g := consumer.GroupConfig{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"}}
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	if g.Linger != defaultConfig().Batch.Linger {
		t.Errorf("the consumer group's default linger is %v, the processor's %v", g.Linger, defaultConfig().Batch.Linger)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, l := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(l, "|") && strings.Contains(l, "`batch-linger`") {
			row = l
		}
	}
	cells := strings.Split(row, "|")
	if len(cells) < 5 {
		t.Fatalf("docs/configuration.md has no configuration row for batch-linger: %q", row)
	}
	// | flags | YAML | defaults | what |: the defaults cell lists max-messages, max-bytes, linger.
	defaults := strings.Split(cells[3], ",")
	if got := strings.TrimSpace(defaults[len(defaults)-1]); got != defaultConfig().Batch.Linger.String() {
		t.Errorf("docs/configuration.md states the batch-linger default as %q, the processor's is %v", got, defaultConfig().Batch.Linger)
	}
}

// The in-flight default is stated in the same three places, and moved from 3 to 4 once.
func TestMaxInFlightDefaultsAgree(t *testing.T) {
	if got := defaultConfig().Batch.MaxInFlight; got != consumer.DefaultMaxInFlight {
		t.Errorf("defaultConfig().Batch.MaxInFlight = %d, want %d", got, consumer.DefaultMaxInFlight)
	}
	g := consumer.GroupConfig{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"}}
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	if g.MaxInFlight != defaultConfig().Batch.MaxInFlight {
		t.Errorf("the consumer group's default is %d batches in flight, the processor's %d", g.MaxInFlight, defaultConfig().Batch.MaxInFlight)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cells []string
	for _, l := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(l, "|") && strings.Contains(l, "`batch-max-in-flight`") {
			cells = strings.Split(l, "|")
		}
	}
	if len(cells) < 5 {
		t.Fatal("docs/configuration.md has no configuration row for batch-max-in-flight")
	}
	if got := strings.TrimSpace(cells[3]); got != strconv.Itoa(defaultConfig().Batch.MaxInFlight) {
		t.Errorf("docs/configuration.md states the batch-max-in-flight default as %q, the processor's is %d", got, defaultConfig().Batch.MaxInFlight)
	}
}

// Every flag of run is in docs/configuration.md's reference, by its full name: a flag added
// without its line there fails here.
func TestConfigurationReferenceNamesEveryFlag(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	c := defaultConfig()
	for _, s := range c.settings() {
		if !strings.Contains(string(doc), "`"+s.name+"`") {
			t.Errorf("flag %s is not in docs/configuration.md", s.name)
		}
	}
}
