package envoy

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBootstrap(t *testing.T) {
	cases := []struct {
		name    string
		cfg     BootstrapConfig
		want    []string
		wantErr string
	}{
		{"defaults", BootstrapConfig{NodeID: "n1"},
			[]string{`"id":"n1"`, `"cluster":"aether"`, `"portValue":15000`, `"portValue":15010`, `"apiType":"DELTA_GRPC"`, `"clusterName":"aether-xds"`}, ""},
		{"unix sockets, state of the world", BootstrapConfig{NodeID: "n1", XDSAddress: "unix:///run/aether/xds.sock", AdminAddress: "unix:///run/aether/admin.sock", StateOfTheWorld: true},
			[]string{`"path":"/run/aether/xds.sock"`, `"path":"/run/aether/admin.sock"`, `"apiType":"GRPC"`}, ""},
		{"no node id", BootstrapConfig{}, nil, "NodeID"},
		{"bad admin address", BootstrapConfig{NodeID: "n", AdminAddress: "localhost"}, nil, `AdminAddress "localhost"`},
		{"bad xds port", BootstrapConfig{NodeID: "n", XDSAddress: "127.0.0.1:99999"}, nil, `XDSAddress "127.0.0.1:99999"`},
		{"empty unix path", BootstrapConfig{NodeID: "n", XDSAddress: "unix://"}, nil, "empty unix socket path"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := Bootstrap(c.cfg)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("Bootstrap() error = %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var compact strings.Builder
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatal(err)
			}
			out, _ := json.Marshal(v)
			compact.Write(out)
			for _, w := range c.want {
				if !strings.Contains(compact.String(), w) {
					t.Errorf("bootstrap lacks %s:\n%s", w, compact.String())
				}
			}
		})
	}
}
