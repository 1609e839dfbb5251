// Command client is the substrate's client workload. As a pod it idles ("client sleep"); tests
// run its one-shot modes inside the pod's namespaces (Cluster.ExecInPod), like kubectl exec:
//
//	client http URL          GET URL, print the body; fail on a non-2xx status
//	client grpc ADDR MESSAGE call /aether.e2e.Echo/Echo (StringValue in and out), print the answer
//	client tcp ADDR MESSAGE  send one line, print the one-line answer
//	client banner ADDR       connect, print the first line the server sends (server-first)
//	client resolve NAME      print the addresses NAME resolves to, one a line
//	client relay ADDR        connect, then copy stdin to the connection and the connection to
//	                         stdout until both ends closed (a pod-side TCP connection driven
//	                         through kubectl exec: the kind cluster pair's Dial)
//	client read FILE         print the file (a Secret or ConfigMap volume: the images have no cat)
//	client sleep             wait for SIGTERM
//
// Flag -timeout (default 5s) bounds every mode but sleep; for relay it bounds the connect only.
// Flag -H "Name: value" (repeatable) adds a request header in http mode (a forged
// x-forwarded-client-cert, say).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func main() {
	timeout := flag.Duration("timeout", 5*time.Second, "timeout of one-shot modes")
	headers := http.Header{}
	flag.Func("H", `request header "Name: value" in http mode (repeatable)`, func(v string) error {
		name, value, ok := strings.Cut(v, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return fmt.Errorf("-H %q: want \"Name: value\"", v)
		}
		headers.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		return nil
	})
	flag.Parse()
	requestHeaders = headers
	if err := run(flag.Args(), *timeout, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
}

// requestHeaders are the -H headers, added to every http-mode request.
var requestHeaders = http.Header{}

func run(args []string, timeout time.Duration, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: client http URL | grpc ADDR MESSAGE | tcp ADDR MESSAGE | udp ADDR MESSAGE | banner ADDR | resolve NAME | relay ADDR | read FILE | sleep")
	}
	if args[0] == "relay" {
		if len(args) != 2 {
			return fmt.Errorf("bad arguments %q", args)
		}
		return relay(args[1], timeout, os.Stdin, out)
	}
	if args[0] == "read" {
		// The images have no shell or cat: this is how a test reads a file in a pod (a Secret
		// or ConfigMap volume, the pod's resolv.conf).
		if len(args) != 2 {
			return fmt.Errorf("bad arguments %q", args)
		}
		b, err := os.ReadFile(args[1])
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	if args[0] == "sleep" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		<-ctx.Done()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	need := map[string]int{"http": 2, "grpc": 3, "tcp": 3, "udp": 3, "banner": 2, "resolve": 2}
	if n, ok := need[args[0]]; !ok || len(args) != n {
		return fmt.Errorf("bad arguments %q", args)
	}
	var d net.Dialer
	switch args[0] {
	case "http":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[1], nil)
		if err != nil {
			return err
		}
		for k, vs := range requestHeaders {
			req.Header[k] = vs
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(out, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("GET %s: %s", args[1], resp.Status)
		}
	case "grpc":
		conn, err := grpc.NewClient(args[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		var resp wrapperspb.StringValue
		if err := conn.Invoke(ctx, "/aether.e2e.Echo/Echo", wrapperspb.String(args[2]), &resp); err != nil {
			return fmt.Errorf("call %s: %w", args[1], err)
		}
		_, err = fmt.Fprintln(out, resp.GetValue())
		return err
	case "tcp", "banner":
		c, err := d.DialContext(ctx, "tcp", args[1])
		if err != nil {
			return err
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		if args[0] == "tcp" {
			if _, err := fmt.Fprintln(c, args[2]); err != nil {
				return err
			}
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return fmt.Errorf("read from %s: %w", args[1], err)
		}
		_, err = io.WriteString(out, line)
		return err
	case "udp":
		// One datagram, one answer: the first datagram back within the timeout.
		c, err := d.DialContext(ctx, "udp", args[1])
		if err != nil {
			return err
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		if _, err := io.WriteString(c, args[2]); err != nil {
			return err
		}
		buf := make([]byte, 2048)
		n, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("read from %s: %w", args[1], err)
		}
		_, err = out.Write(buf[:n])
		return err
	case "resolve":
		addrs, err := net.DefaultResolver.LookupHost(ctx, args[1])
		if err != nil {
			return err
		}
		for _, a := range addrs {
			fmt.Fprintln(out, a)
		}
	}
	return nil
}

// relay connects to addr within timeout and copies in to the connection (then half-closes it)
// and the connection to out, until the peer closes.
func relay(addr string, timeout time.Duration, in io.Reader, out io.Writer) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	go func() {
		_, _ = io.Copy(c, in)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	if _, err := io.Copy(out, c); err != nil {
		return fmt.Errorf("relay from %s: %w", addr, err)
	}
	return nil
}
