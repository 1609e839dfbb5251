package model

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestCoalescerBurst(t *testing.T) {
	var runs atomic.Int32
	c := NewCoalescer(100*time.Millisecond, time.Second, func() { runs.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	for i := 0; i < 1000; i++ {
		c.Trigger()
	}
	deadline := time.Now().Add(10 * time.Second)
	for runs.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(1200 * time.Millisecond) // longer than maxDelay: any further run would show now
	if n := runs.Load(); n != 1 {
		t.Fatalf("1000 triggers in one burst ran fn %d times, want 1", n)
	}
	c.Trigger()
	for runs.Load() == 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if runs.Load() != 2 {
		t.Fatalf("a trigger after the burst did not run fn again")
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
