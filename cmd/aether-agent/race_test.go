//go:build race

package main

// raceEnabled: the tests run under -race, so the agent binary they start is built with it too.
const raceEnabled = true
