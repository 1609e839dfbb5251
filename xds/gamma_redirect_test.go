package xds

import (
	"testing"

	"github.com/aethermesh/aether/model"
)

// TestRedirectPort: the port_redirect of a RequestRedirect gives the Location the port
// HTTPRequestRedirectFilter.port asks for (the filter's port, else the scheme's well-known port,
// else the frontend port) on real Envoy, which keeps the Host's port when port_redirect is
// unset (TestPrivilegedGAMMATraffic/RequestRedirect sees the Locations).
func TestRedirectPort(t *testing.T) {
	for _, c := range []struct {
		name string
		d    model.Redirect
		port uint32
		want uint32
	}{
		{"port 80, path only: no port", model.Redirect{}, 80, 0},
		{"port 80, hostname: no port", model.Redirect{Hostname: "new.example"}, 80, 0},
		{"port 80, https: no port (Envoy drops a Host :80 when leaving http)", model.Redirect{Scheme: "https"}, 80, 0},
		{"port 80, http: no port", model.Redirect{Scheme: "http"}, 80, 0},
		{"port 80, filter port", model.Redirect{Port: 8443}, 80, 8443},
		{"port 80, https and 443", model.Redirect{Scheme: "https", Port: 443}, 80, 0},
		{"port 8080, path only: the frontend port", model.Redirect{}, 8080, 8080},
		{"port 8080, hostname: the frontend port", model.Redirect{Hostname: "new.example"}, 8080, 8080},
		{"port 8080, https: 443, explicit (the Host says :8080)", model.Redirect{Scheme: "https"}, 8080, 443},
		{"port 8080, http: 80, explicit", model.Redirect{Scheme: "http"}, 8080, 80},
		{"port 8080, https and hostname: no port", model.Redirect{Scheme: "https", Hostname: "secure.example"}, 8080, 0},
		{"port 8080, filter port", model.Redirect{Port: 9000}, 8080, 9000},
		{"port 8080, hostname and filter port 80: no port", model.Redirect{Hostname: "new.example", Port: 80}, 8080, 0},
		{"port 443, path only: 443 (http on 443)", model.Redirect{}, 443, 443},
	} {
		if got := redirectPort(&c.d, c.port); got != c.want {
			t.Errorf("%s: redirectPort(%+v, %d) = %d, want %d", c.name, c.d, c.port, got, c.want)
		}
	}
}
