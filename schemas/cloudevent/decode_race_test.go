//go:build race

package cloudevent

// raceEnabled: allocation counts are not checked under the race detector.
const raceEnabled = true
