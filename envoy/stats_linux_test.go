//go:build linux

package envoy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestAdminSocketAndStatsListener runs the real Envoy on the agent's bootstrap with the admin API
// on a unix socket and the stats listener on TCP: the socket is 0600 and serves the whole admin
// API; the stats listener serves GET /stats/prometheus and /ready and refuses everything else
// with 404, however the path is spelled (a mutating admin path, a dot-segment or
// percent-encoded escape towards one, another method), and Envoy is still running afterwards.
func TestAdminSocketAndStatsListener(t *testing.T) {
	testenv.RequireTools(t, testenv.ToolEnvoy)
	sock := filepath.Join(t.TempDir(), "admin.sock")
	port := testenv.FreePort(t)
	raw, err := Bootstrap(BootstrapConfig{NodeID: "n1", AdminAddress: "unix://" + sock, StatsAddress: fmt.Sprintf("127.0.0.1:%d", port)})
	if err != nil {
		t.Fatal(err)
	}
	// No xDS server here: drop the dynamic resources and the ADS cluster, keep the rest.
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	b.DynamicResources = nil
	b.StaticResources.Clusters = b.StaticResources.Clusters[1:]
	out, err := protojson.Marshal(&b)
	if err != nil {
		t.Fatal(err)
	}
	e := testenv.StartEnvoy(t, string(out), testenv.EnvoyOptions{SkipReadyWait: true})
	stats := fmt.Sprintf("http://127.0.0.1:%d", port)
	do := func(method, path string) (int, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, stats+path, nil)
		if err != nil {
			return 0, "", err
		}
		req.URL.Opaque = path // send the path as written, escapes and dot-segments included
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	testenv.Eventually(t, 60*time.Second, "stats listener answers /ready", func() error {
		code, body, err := do(http.MethodGet, "/ready")
		if err != nil || code != http.StatusOK || !strings.Contains(body, "LIVE") {
			return fmt.Errorf("/ready: %d %q %v; log:\n%s", code, body, err, testenv.Tail(readFile(e.LogPath), 20))
		}
		return nil
	})
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("admin socket mode %v, want a 0600 socket", fi.Mode())
	}
	c, base := AdminClient("unix://" + sock)
	code, body, err := adminGet(context.Background(), c, base+"/server_info")
	if err != nil || code != http.StatusOK || !strings.Contains(string(body), `"n1"`) {
		t.Fatalf("admin over the socket: %d %v %.200s", code, err, body)
	}

	code, body2, err := do(http.MethodGet, "/stats/prometheus")
	if err != nil || code != http.StatusOK || !strings.Contains(body2, "envoy_server_live") {
		t.Fatalf("GET /stats/prometheus: %d %v %.200s", code, err, body2)
	}
	for _, r := range []struct{ method, path string }{
		{http.MethodPost, "/quitquitquit"},
		{http.MethodGet, "/config_dump"},
		{http.MethodGet, "/clusters"},
		{http.MethodPost, "/stats/prometheus"},
		{http.MethodGet, "/stats/prometheus/../config_dump"},
		{http.MethodGet, "/stats/prometheus/..%2Fconfig_dump"},
		{http.MethodGet, "/stats/prometheus%2F..%2F..%2Fconfig_dump"},
		{http.MethodGet, "/ready/../certs"},
		{http.MethodPost, "/ready/../quitquitquit"},
		{http.MethodPost, "/logging?level=trace"},
		{http.MethodGet, "/stats"},
	} {
		code, body, err := do(r.method, r.path)
		if err != nil {
			t.Fatalf("%s %s: %v", r.method, r.path, err)
		}
		// 404 from the route table, or a redirect to the unescaped path (which is itself refused).
		if code != http.StatusNotFound && code != http.StatusTemporaryRedirect {
			t.Errorf("%s %s through the stats listener: %d %.200q, want 404", r.method, r.path, code, body)
		}
	}
	// A connection that sends nothing is closed after the idle timeout, so silent connections
	// cannot hold the listener's slots.
	silent, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	_ = silent.SetReadDeadline(time.Now().Add(3 * statsIdleTimeout))
	start := time.Now()
	if _, err := silent.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a silent connection to the stats listener was not closed within %s: %v", 3*statsIdleTimeout, err)
	}
	t.Logf("silent connection closed after %s", time.Since(start).Round(100*time.Millisecond))
	if e.Cmd.ProcessState != nil {
		t.Fatal("Envoy exited")
	}
	if code, _, err := adminGet(context.Background(), c, base+"/ready"); err != nil || code != http.StatusOK {
		t.Fatalf("Envoy no longer ready after the refused requests: %d %v", code, err)
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
