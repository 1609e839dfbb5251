package model

import (
	"context"
	"time"
)

// Coalescer turns a burst of change notifications into few rebuilds. A trigger after a quiet
// period (no run for Quiet) runs fn at once (leading edge), so an isolated change costs no delay.
// Triggers that follow are coalesced: fn runs again once they have been quiet for Quiet, or
// MaxDelay after the first of them, whichever comes first. A storm of events therefore rebuilds
// about once per MaxDelay. fn never runs concurrently with itself.
type Coalescer struct {
	quiet, maxDelay time.Duration
	fn              func()
	ch              chan struct{}
}

// NewCoalescer returns a Coalescer running fn; quiet and maxDelay must be > 0 (maxDelay < quiet is
// raised to quiet).
func NewCoalescer(quiet, maxDelay time.Duration, fn func()) *Coalescer {
	if maxDelay < quiet {
		maxDelay = quiet
	}
	return &Coalescer{quiet: quiet, maxDelay: maxDelay, fn: fn, ch: make(chan struct{}, 1)}
}

// Trigger records a change. It never blocks.
func (c *Coalescer) Trigger() {
	select {
	case c.ch <- struct{}{}:
	default:
	}
}

// Run serves triggers until ctx is done. A trigger still pending when ctx ends is dropped.
func (c *Coalescer) Run(ctx context.Context) {
	var last time.Time // end of the last run
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.ch:
		}
		if time.Since(last) >= c.quiet {
			c.fn()
			last = time.Now()
			continue
		}
		deadline := time.NewTimer(c.maxDelay)
		quiet := time.NewTimer(c.quiet)
	burst:
		for {
			select {
			case <-ctx.Done():
				deadline.Stop()
				quiet.Stop()
				return
			case <-c.ch:
				quiet.Reset(c.quiet)
			case <-quiet.C:
				break burst
			case <-deadline.C:
				break burst
			}
		}
		deadline.Stop()
		quiet.Stop()
		c.fn()
		last = time.Now()
	}
}
