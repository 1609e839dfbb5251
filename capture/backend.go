package capture

import (
	"fmt"
	"time"
)

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

// Pruner is a Backend that also keeps node-wide state outside the pods' netns (bpf/capture's
// maps). Prune removes the state of every pod whose netns is not in keep (the netns paths of the
// live captured attachments) and that was not applied after since (when the caller began
// listing them), and returns how many pods it removed. The repair pass calls it.
type Pruner interface {
	Prune(since time.Time, keep []string) (removed int, err error)
}

// DriftError says how the live rules differ from the wanted rule set.
type DriftError struct {
	What string
}

// Error implements error.
func (e *DriftError) Error() string { return fmt.Sprintf("capture rules drifted: %s", e.What) }
