package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const xfcc = `By=spiffe://aether.internal/ns/demo/sa/echo;Hash=abc;URI=spiffe://aether.internal/ns/demo/sa/client`

func TestXFCCURI(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{xfcc, "spiffe://aether.internal/ns/demo/sa/client"},
		{`URI="spiffe://a/x";By=spiffe://b,By=spiffe://c;URI=spiffe://td/ns/a/sa/last`, "spiffe://td/ns/a/sa/last"},
		{`By=spiffe://b;Hash=x`, ""},
		{`uri="spiffe://td/quoted"`, "spiffe://td/quoted"},
	} {
		if got := xfccURI(tc.in); got != tc.want {
			t.Errorf("xfccURI(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

var self = Reply{Server: "echo-0", Namespace: "demo", Cluster: "alpha"}

func TestHTTPReportsCaller(t *testing.T) {
	srv := httptest.NewServer(httpHandler(self))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/x", nil)
	req.Header.Set("X-Forwarded-Client-Cert", xfcc)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r Reply
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if r.Server != "echo-0" || r.Cluster != "alpha" || r.Protocol != "http" || r.Path != "/x" || r.XFCC != xfcc ||
		r.CallerID != "spiffe://aether.internal/ns/demo/sa/client" || r.Peer == "" {
		t.Errorf("reply %+v", r)
	}
}

func TestTCPEchoesLines(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { _ = serveTCP(l, self) }()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := bufio.NewScanner(c)
	for _, msg := range []string{"one", "two"} {
		fmt.Fprintln(c, msg)
		if !rd.Scan() {
			t.Fatalf("no reply to %q: %v", msg, rd.Err())
		}
		var r Reply
		if err := json.Unmarshal(rd.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.Protocol != "tcp" || r.Message != msg || r.Peer != c.LocalAddr().String() {
			t.Errorf("reply %+v", r)
		}
	}
}

func TestGRPCReportsCaller(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(grpcHandler(self)))
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-forwarded-client-cert", xfcc)
	var out wrapperspb.StringValue
	if err := conn.Invoke(ctx, "/aether.e2e.Echo/Echo", wrapperspb.String("hi"), &out); err != nil {
		t.Fatal(err)
	}
	var r Reply
	if err := json.Unmarshal([]byte(out.GetValue()), &r); err != nil {
		t.Fatal(err)
	}
	if r.Protocol != "grpc" || r.Message != "hi" || r.Path != "/aether.e2e.Echo/Echo" || r.CallerID != "spiffe://aether.internal/ns/demo/sa/client" || r.Peer == "" {
		t.Errorf("reply %+v", r)
	}
}

func TestUDPAnswersEachDatagram(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() { _ = serveUDP(pc, self) }()
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	for _, msg := range []string{"one", "two"} {
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("no reply to %q: %v", msg, err)
		}
		var r Reply
		if err := json.Unmarshal(buf[:n], &r); err != nil {
			t.Fatal(err)
		}
		if r.Protocol != "udp" || r.Message != msg || r.Peer != c.LocalAddr().String() || r.Server != self.Server {
			t.Errorf("reply %+v", r)
		}
	}
}
