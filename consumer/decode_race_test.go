//go:build race

package consumer

// raceEnabled: allocation counts are not checked under the race detector.
const raceEnabled = true
