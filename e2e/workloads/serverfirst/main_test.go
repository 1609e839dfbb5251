package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"testing"
	"time"
)

func TestBannerBeforeClientSpeaks(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = run(ctx, addr, "220 smtp-0 alpha ready\r\n") }()
	var c net.Conn
	for i := 0; i < 100; i++ {
		if c, err = net.Dial("tcp", addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	rd := bufio.NewReader(c)
	// Nothing is sent before the banner arrives.
	if line, err := rd.ReadString('\n'); err != nil || line != "220 smtp-0 alpha ready\r\n" {
		t.Fatalf("banner %q, %v", line, err)
	}
	fmt.Fprintln(c, "HELO x")
	if line, err := rd.ReadString('\n'); err != nil || line != "250 HELO x\r\n" {
		t.Fatalf("reply %q, %v", line, err)
	}
}
