package model

import (
	"context"
	"time"
)

// Coalescer turns a burst of change notifications into few rebuilds: after a Trigger, fn runs once
// the triggers have been quiet for Quiet, or MaxDelay after the first trigger not yet served,
// whichever comes first. A storm of events therefore rebuilds at most once per MaxDelay, and a
// single event waits at most Quiet. fn never runs concurrently with itself.
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
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.ch:
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
	}
}
