package xds

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
)

// getBody GETs url with the client and returns status and body.
func getBody(c *http.Client, url string, hdr map[string]string) (int, string, http.Header, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", nil, err
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

// echoPost answers a POST with its body, with a Content-Length (a plain io.Copy would make the
// answer chunked).
func echoPost(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// serveEach runs handle on its own goroutine for every connection l accepts, closing the
// connection afterwards, until l is closed.
func serveEach(l net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); handle(c) }()
		}
	}()
}

// serveEcho echoes bytes back on every connection l accepts.
func serveEcho(l net.Listener) {
	serveEach(l, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// serveBanner writes banner first on every connection l accepts, then echoes.
func serveBanner(l net.Listener, banner string) {
	serveEach(l, func(c net.Conn) {
		if _, err := io.WriteString(c, banner); err == nil {
			_, _ = io.Copy(c, c)
		}
	})
}

// readBanner reads len(want) bytes from c and compares.
func readBanner(c net.Conn, want string) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("read banner: %w", err)
	}
	if string(buf) != want {
		return fmt.Errorf("banner = %q, want %q", buf, want)
	}
	return nil
}

// testCA returns a development CA for trust domain td (SVID lifetime given) and the CA's PEM.
func testCA(t testing.TB, td string, lifetime time.Duration) (*identity.DevCA, *testenv.CA) {
	t.Helper()
	ca, err := testenv.NewCA("aether test CA")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := identity.NewDevCA(ca.CertPEM, ca.KeyPEM, td, lifetime)
	if err != nil {
		t.Fatal(err)
	}
	return dev, ca
}

// peerURIs returns the URI SANs of the TLS peer's leaf certificate.
func peerURIs(cs *tls.ConnectionState) string {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return ""
	}
	var out []string
	for _, u := range cs.PeerCertificates[0].URIs {
		out = append(out, u.String())
	}
	return strings.Join(out, ",")
}

// mtlsHTTPServer serves HTTPS on l requiring a client certificate from bundle, answering every
// request with the client's URI SAN and the connection's remote address.
func mtlsHTTPServer(t testing.TB, l net.Listener, svid *identity.SVID, bundle []byte) {
	t.Helper()
	cert, err := tls.X509KeyPair(svid.CertChainPEM, svid.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s|%s", peerURIs(r.TLS), r.RemoteAddr)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert},
	}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { srv.Close() })
}

// echoVia dials addr from inside ns and checks that msg comes back unchanged (testenv.EchoOnce).
func echoVia(ns *testenv.Netns, addr, msg string) error {
	c, err := ns.Dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return testenv.EchoOnce(c, msg)
}

// dialEcho opens a new connection from ns to addr, writes body, reads as many bytes back into
// buf (len(body)) and closes it: one sample of the latency benchmarks' TCP paths.
func dialEcho(ns *testenv.Netns, addr string, body, buf []byte) error {
	c, err := ns.Dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write(body); err != nil {
		return err
	}
	_, err = io.ReadFull(c, buf)
	return err
}
