package capture

import "fmt"

// Backend installs, verifies and removes a pod's rule set in the pod's netns. Implementations are
// idempotent and tolerate half-applied state: Apply on top of anything yields exactly the rule
// set, Teardown of nothing succeeds.
type Backend interface {
	// Apply makes the netns at netnsPath hold exactly rs and reports whether it changed anything.
	Apply(netnsPath string, rs RuleSet) (changed bool, err error)
	// Check returns nil when the netns holds exactly rs, a *DriftError when it does not, or
	// another error when it cannot tell.
	Check(netnsPath string, rs RuleSet) error
	// Teardown removes every aether rule from the netns; a missing netns or missing rules is
	// success.
	Teardown(netnsPath string) error
}

// DriftError says how the live rules differ from the wanted rule set.
type DriftError struct {
	What string
}

// Error implements error.
func (e *DriftError) Error() string { return fmt.Sprintf("capture rules drifted: %s", e.What) }
