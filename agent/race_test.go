//go:build race

package agent

// raceEnabled: the tests run under -race, so the agent binary they start is built with it too.
const raceEnabled = true
