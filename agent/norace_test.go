//go:build !race

package agent

// raceEnabled: benchmarks (run without -race) measure an agent built without the detector.
const raceEnabled = false
