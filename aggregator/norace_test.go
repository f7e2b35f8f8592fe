//go:build !race

package aggregator

// raceEnabled: allocation counts are not checked under the race detector, whose sync.Pool drops
// some of what it is given.
const raceEnabled = false
