package registryflag

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aethermesh/aether/internal/envflag"
)

// parse defines the flags with u on a fresh flag set, parses args with env as the environment
// and returns the values and the usage text.
func parse(t *testing.T, u Usage, env map[string]string, args ...string) (Flags, string) {
	t.Helper()
	var f Flags
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var usage strings.Builder
	fs.SetOutput(&usage)
	ef := &envflag.Set{FS: fs, Getenv: func(k string) string { return env[k] }}
	f.Define(ef, u)
	if err := ef.Parse(args); err != nil {
		t.Fatal(err)
	}
	fs.PrintDefaults()
	return f, usage.String()
}

// TestDefineUsage: the four flags print the help text the binaries printed before they shared
// this package, with a binary's own text where Usage gives one.
func TestDefineUsage(t *testing.T) {
	line := func(name, text string) string { return "  -" + name + " string\n    \t" + text + "\n" }
	for _, tc := range []struct {
		name     string
		u        Usage
		endpoint string
		cert     string
	}{
		{"agent", Usage{}, "comma-separated etcd client URLs of the registry", "client certificate for the registry"},
		{"registrar", Usage{Endpoints: "comma-separated etcd client URLs of the registry; empty: run an embedded single-member etcd"},
			"comma-separated etcd client URLs of the registry; empty: run an embedded single-member etcd", "client certificate for the registry"},
		{"setup-registry-auth", Usage{Cert: "client certificate for the registry (with --client-cert-auth, CN root)"},
			"comma-separated etcd client URLs of the registry", "client certificate for the registry (with --client-cert-auth, CN root)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, got := parse(t, tc.u, nil)
			want := line("registry-ca", "CA bundle for the registry's TLS (env AETHER_REGISTRY_CA)") +
				line("registry-cert", tc.cert+" (env AETHER_REGISTRY_CERT)") +
				line("registry-endpoints", tc.endpoint+" (env AETHER_REGISTRY_ENDPOINTS)") +
				"  -registry-insecure\n    \tallow plaintext http:// registry endpoints off loopback (they carry every cluster's endpoints and the etcd credentials; use https:// with --registry-ca instead), and, with etcd authentication on, an etcd user that is not this cluster's own (registry.UserName) (env AETHER_REGISTRY_INSECURE)\n" +
				line("registry-key", "client key for the registry (env AETHER_REGISTRY_KEY)")
			if got != want {
				t.Errorf("usage:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestValues: the environment gives the defaults, flags win, endpoints are split and trimmed.
func TestValues(t *testing.T) {
	env := map[string]string{"AETHER_REGISTRY_ENDPOINTS": "https://a:2379, https://b:2379,", "AETHER_REGISTRY_CA": "/env/ca.pem",
		"AETHER_REGISTRY_CERT": "/env/cert.pem", "AETHER_REGISTRY_KEY": "/env/key.pem"}
	f, _ := parse(t, Usage{}, env)
	if !slices.Equal(f.Endpoints(), []string{"https://a:2379", "https://b:2379"}) || f.CA != "/env/ca.pem" || f.Cert != "/env/cert.pem" || f.Key != "/env/key.pem" {
		t.Errorf("from env: %+v, endpoints %q", f, f.Endpoints())
	}
	f, _ = parse(t, Usage{}, env, "--registry-endpoints", "http://c:2379", "--registry-ca", "/flag/ca.pem", "--registry-key", "/flag/key.pem")
	if !slices.Equal(f.Endpoints(), []string{"http://c:2379"}) || f.CA != "/flag/ca.pem" || f.Cert != "/env/cert.pem" || f.Key != "/flag/key.pem" {
		t.Errorf("flags over env: %+v, endpoints %q", f, f.Endpoints())
	}
	if f, _ := parse(t, Usage{}, nil); f.Endpoints() != nil {
		t.Errorf("no endpoints: %q, want nil", f.Endpoints())
	}
}

// TestCheckTLS: certificate and key go together; every file named must exist; each error names
// the flag and its value. TLS loads the files (an error names them) or is nil for plaintext.
func TestCheckTLS(t *testing.T) {
	file := filepath.Join(t.TempDir(), "x.pem")
	if err := os.WriteFile(file, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    Flags
		want []string // substrings, one per error
	}{
		{"plaintext", Flags{}, nil},
		{"all present", Flags{CA: file, Cert: file, Key: file}, nil},
		{"cert without key", Flags{Cert: file}, []string{"--registry-cert and --registry-key go together"}},
		{"key without cert", Flags{Key: file}, []string{"--registry-cert and --registry-key go together"}},
		{"missing CA", Flags{CA: "/nonexistent/ca.pem"}, []string{`--registry-ca "/nonexistent/ca.pem"`}},
		{"missing cert and key", Flags{Cert: "/nonexistent/c.pem", Key: "/nonexistent/k.pem"},
			[]string{`--registry-cert "/nonexistent/c.pem"`, `--registry-key "/nonexistent/k.pem"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := tc.f.CheckTLS()
			if len(errs) != len(tc.want) {
				t.Fatalf("CheckTLS = %v, want %d errors naming %q", errs, len(tc.want), tc.want)
			}
			for i, err := range errs {
				if !strings.Contains(err.Error(), tc.want[i]) {
					t.Errorf("error %d = %v, want it to name %q", i, err, tc.want[i])
				}
			}
		})
	}
	if c, err := (Flags{}).TLS(); c != nil || err != nil {
		t.Errorf("TLS() without files = %v, %v; want nil, nil", c, err)
	}
	if _, err := (Flags{Cert: file, Key: file}).TLS(); err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("TLS() with a certificate that is not PEM = %v, want an error naming %s", err, file)
	}
}

// TestPlaintextOffLoopbackRefused: a plaintext endpoint off loopback is refused by CheckTLS,
// naming the flag, the endpoint and the way out, unless --registry-insecure (or its variable);
// https:// and loopback endpoints pass.
func TestPlaintextOffLoopbackRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		refused []string
	}{
		{"loopback plaintext", nil, []string{"--registry-endpoints", "http://127.0.0.1:2379,http://localhost:2379,http://[::1]:2379"}, nil},
		{"tls off loopback", nil, []string{"--registry-endpoints", "https://10.0.0.5:2379"}, nil},
		{"plaintext off loopback", nil, []string{"--registry-endpoints", "http://10.0.0.5:2379, https://10.0.0.6:2379,registry.example:2379"},
			[]string{"http://10.0.0.5:2379", "registry.example:2379"}},
		{"insecure flag", nil, []string{"--registry-endpoints", "http://10.0.0.5:2379", "--registry-insecure"}, nil},
		{"insecure variable", map[string]string{"AETHER_REGISTRY_INSECURE": "true"}, []string{"--registry-endpoints", "http://10.0.0.5:2379"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := parse(t, Usage{}, tc.env, tc.args...)
			errs := f.CheckTLS()
			if len(errs) != len(tc.refused) {
				t.Fatalf("CheckTLS = %v, want %d refusals (%v)", errs, len(tc.refused), tc.refused)
			}
			for i, e := range tc.refused {
				msg := errs[i].Error()
				if !strings.Contains(msg, "--registry-endpoints") || !strings.Contains(msg, e) || !strings.Contains(msg, "--registry-insecure") {
					t.Errorf("refusal %q: want the flag, %q and --registry-insecure named", msg, e)
				}
			}
			if f.Insecure && len(f.PlaintextEndpoints()) != 1 {
				t.Errorf("PlaintextEndpoints = %v, want the one to warn about", f.PlaintextEndpoints())
			}
		})
	}
}
