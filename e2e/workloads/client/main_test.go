package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			http.Error(w, "no", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "body")
	}))
	defer srv.Close()
	var out strings.Builder
	if err := run([]string{"http", srv.URL + "/ok"}, 5*time.Second, &out); err != nil || out.String() != "body" {
		t.Errorf("http: %q, %v", out.String(), err)
	}
	if err := run([]string{"http", srv.URL + "/fail"}, 5*time.Second, &out); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("http on 503: err %v, want one naming the status", err)
	}
}

func TestTCPAndBanner(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprint(c, "220 hello\r\n")
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "got %s\n", sc.Text())
				}
			}()
		}
	}()
	var out strings.Builder
	if err := run([]string{"banner", l.Addr().String()}, 5*time.Second, &out); err != nil || out.String() != "220 hello\r\n" {
		t.Errorf("banner: %q, %v", out.String(), err)
	}
	out.Reset()
	// tcp reads the first line after sending: here the banner.
	if err := run([]string{"tcp", l.Addr().String(), "x"}, 5*time.Second, &out); err != nil || out.String() != "220 hello\r\n" {
		t.Errorf("tcp: %q, %v", out.String(), err)
	}
}

func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{nil, {"http"}, {"tcp", "a"}, {"nope", "x"}, {"read"}, {"read", "/nonexistent/file"}} {
		if err := run(args, time.Second, &strings.Builder{}); err == nil {
			t.Errorf("run(%q): no error", args)
		}
	}
}

// TestRead: "client read FILE" prints the file byte for byte.
func TestRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte("s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := run([]string{"read", p}, time.Second, &out); err != nil || out.String() != "s3cr3t\n" {
		t.Fatalf("read: %q, %v", out.String(), err)
	}
}

func TestRelay(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		rd := bufio.NewReader(c)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			fmt.Fprint(c, "echo: "+line)
		}
	}()
	var out strings.Builder
	if err := relay(l.Addr().String(), 5*time.Second, strings.NewReader("one\ntwo\n"), &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "echo: one\necho: two\n" {
		t.Errorf("relay output %q", out.String())
	}
	if err := run([]string{"relay"}, time.Second, &out); err == nil {
		t.Error("relay without an address: no error")
	}
}

func TestUDP(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(append([]byte("got "), buf[:n]...), from)
		}
	}()
	var out strings.Builder
	if err := run([]string{"udp", pc.LocalAddr().String(), "ping"}, 5*time.Second, &out); err != nil || out.String() != "got ping" {
		t.Errorf("udp: %q, %v", out.String(), err)
	}
	// Nothing answers: the timeout.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if err := run([]string{"udp", silent.LocalAddr().String(), "ping"}, 200*time.Millisecond, &out); err == nil {
		t.Error("udp to a silent peer: no error")
	}
}
