// Command serverfirst is a server-first TCP workload (like SMTP, MySQL or SSH, the server speaks
// first): on accept it sends "220 <pod> <cluster> ready" before reading anything, then answers
// each line with "250 <line>". A proxy that waits for the client's first bytes stalls on it.
//
// Flag: -addr (default :2525). Identity from POD_NAME and CLUSTER.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	addr := flag.String("addr", ":2525", "listen address")
	flag.Parse()
	host, _ := os.Hostname()
	name := os.Getenv("POD_NAME")
	if name == "" {
		name = host
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, *addr, fmt.Sprintf("220 %s %s ready\r\n", name, os.Getenv("CLUSTER"))); ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "serverfirst:", err)
		os.Exit(1)
	}
}

// run serves until the listener fails or ctx ends; it always returns the accept error.
func run(ctx context.Context, addr, banner string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			if _, err := c.Write([]byte(banner)); err != nil {
				return
			}
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				if _, err := fmt.Fprintf(c, "250 %s\r\n", sc.Text()); err != nil {
					return
				}
			}
		}()
	}
}
