package model

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestCoalescerBurst(t *testing.T) {
	var runs atomic.Int32
	c := NewCoalescer(time.Second, 2*time.Second, func() { runs.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	waitRuns := func(n int32) {
		deadline := time.Now().Add(10 * time.Second)
		for runs.Load() < n && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	c.Trigger() // isolated: runs at once
	waitRuns(1)
	for i := 0; i < 1000; i++ { // right after a run: coalesced
		c.Trigger()
	}
	waitRuns(2)
	time.Sleep(2500 * time.Millisecond) // longer than maxDelay: any further run would show now
	if n := runs.Load(); n != 2 {
		t.Fatalf("a trigger then a burst of 1000 ran fn %d times, want 2", n)
	}
}

func TestCoalescerLeadingEdge(t *testing.T) {
	// An isolated trigger runs fn without waiting for the quiet period (an hour here).
	ran := make(chan struct{}, 1)
	c := NewCoalescer(time.Hour, time.Hour, func() { ran <- struct{}{} })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	c.Trigger()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("an isolated trigger waited for the quiet period")
	}
}

func TestCoalescerMaxDelay(t *testing.T) {
	// Triggers every 5 ms never leave a quiet gap of 50 ms, so only maxDelay lets fn run.
	ran := make(chan time.Time, 10)
	c := NewCoalescer(50*time.Millisecond, 100*time.Millisecond, func() { ran <- time.Now() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	stop := time.After(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ran:
			return
		case <-tick.C:
			c.Trigger()
		case <-stop:
			t.Fatal("a steady stream of triggers starved fn: maxDelay not honoured")
		}
	}
}
