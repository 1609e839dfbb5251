package cni

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/cni/plugin"

	"github.com/containernetworking/cni/libcni"
)

const flannelConflist = `{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

func newInstaller(t *testing.T) (*Installer, string) {
	dir := t.TempDir()
	in := &Installer{ConfDir: filepath.Join(dir, "net.d"), BinDir: filepath.Join(dir, "bin"),
		Plugin: map[string]any{"agentSocket": "/var/run/aether/cni.sock", "excludeOutboundPorts": []int{22}}}
	if err := os.MkdirAll(in.ConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(in.ConfDir, "10-flannel.conflist")
	if err := os.WriteFile(path, []byte(flannelConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	return in, path
}

func pluginTypes(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("conflist is not JSON: %v\n%s", err, b)
	}
	var out []string
	for _, p := range v.Plugins {
		out = append(out, p.Type)
	}
	return out
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

func TestInstallerEnsureIdempotentAndUninstall(t *testing.T) {
	in, path := newInstaller(t)
	// A later file in lexical order is not the primary conflist and stays untouched.
	other := filepath.Join(in.ConfDir, "99-other.conflist")
	_ = os.WriteFile(other, []byte(`{"name":"x","cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}`), 0o644)

	got, changed, err := in.Ensure()
	if err != nil || got != path || !changed {
		t.Fatalf("Ensure = %s, %v, %v", got, changed, err)
	}
	if tp := pluginTypes(t, path); !reflect.DeepEqual(tp, []string{"flannel", "portmap", plugin.PluginName}) {
		t.Fatalf("plugins = %v", tp)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o644 {
		t.Fatalf("mode = %v, want 0644 kept", st.Mode())
	}
	before, _ := os.ReadFile(path)
	if _, changed, err := in.Ensure(); err != nil || changed {
		t.Fatalf("second Ensure changed = %v, %v", changed, err)
	}
	after, _ := os.ReadFile(path)
	if string(before) != string(after) {
		t.Fatal("second Ensure rewrote the file")
	}
	// A changed aether-cni config replaces the entry instead of adding a second one.
	in.Plugin["excludeOutboundPorts"] = []int{22, 2379}
	if _, changed, err := in.Ensure(); err != nil || !changed {
		t.Fatalf("Ensure after config change = %v, %v", changed, err)
	}
	if tp := pluginTypes(t, path); len(tp) != 3 || tp[2] != plugin.PluginName {
		t.Fatalf("plugins = %v", tp)
	}
	if tp := pluginTypes(t, other); !reflect.DeepEqual(tp, []string{"bridge"}) {
		t.Fatalf("other conflist changed: %v", tp)
	}

	if err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if !jsonEqual(t, b, []byte(flannelConflist)) {
		t.Fatalf("after uninstall the conflist differs from the original:\n%s", b)
	}
	if err := in.Uninstall(); err != nil {
		t.Fatalf("second Uninstall: %v", err)
	}
}

func TestInstallerBinary(t *testing.T) {
	in, _ := newInstaller(t)
	src := filepath.Join(t.TempDir(), "aether-cni")
	_ = os.WriteFile(src, []byte("#!/bin/sh\n"), 0o600)
	in.Binary = src
	for i := 0; i < 2; i++ {
		if err := in.InstallBinary(); err != nil {
			t.Fatal(err)
		}
	}
	st, err := os.Stat(filepath.Join(in.BinDir, plugin.PluginName))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("installed binary: %v, %v", st, err)
	}
	if err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(in.BinDir, plugin.PluginName)); !os.IsNotExist(err) {
		t.Fatalf("binary still there after uninstall: %v", err)
	}
}

// TestInstallerConvertsSinglePluginConf: a single-plugin .conf first in order (Multus's
// 00-multus.conf, a bare bridge config) becomes <base>.conflist holding that plugin and then
// aether-cni, which libcni loads; the .conf is gone and a second Ensure changes nothing. When the
// primary CNI writes its .conf again, the conflist is made anew from it.
func TestInstallerConvertsSinglePluginConf(t *testing.T) {
	in, _ := newInstaller(t)
	conf := filepath.Join(in.ConfDir, "05-single.conf")
	single := `{"cniVersion":"0.3.1","name":"mynet","type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.1.0.0/16"}}`
	if err := os.WriteFile(conf, []byte(single), 0o600); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(in.ConfDir, "05-single.conflist")
	for round := 1; round <= 2; round++ {
		path, changed, err := in.Ensure()
		if err != nil || path != want || !changed {
			t.Fatalf("round %d: Ensure = %q, %v, %v; want %q, changed", round, path, changed, err, want)
		}
		if _, err := os.Stat(conf); !os.IsNotExist(err) {
			t.Errorf("round %d: %s still there (stat err %v)", round, conf, err)
		}
		list, err := libcni.ConfListFromFile(want)
		if err != nil {
			t.Fatalf("round %d: libcni cannot load the conflist: %v", round, err)
		}
		if list.Name != "mynet" || list.CNIVersion != "0.3.1" || len(list.Plugins) != 2 || list.Plugins[0].Network.Type != "bridge" || list.Plugins[1].Network.Type != plugin.PluginName {
			t.Errorf("round %d: conflist %s %s with %d plugins %+v; want mynet 0.3.1 [bridge aether-cni]", round, list.Name, list.CNIVersion, len(list.Plugins), list.Plugins)
		}
		var bridge map[string]any
		if err := json.Unmarshal(list.Plugins[0].Bytes, &bridge); err != nil || bridge["bridge"] != "cni0" || bridge["ipam"] == nil {
			t.Errorf("round %d: bridge plugin lost keys: %s", round, list.Plugins[0].Bytes)
		}
		if st, err := os.Stat(want); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("round %d: conflist mode %v (%v), want the .conf's 0600", round, st.Mode().Perm(), err)
		}
		if _, changed, err := in.Ensure(); err != nil || changed {
			t.Errorf("round %d: second Ensure = changed %v, %v; want no change", round, changed, err)
		}
		// The primary CNI writes its .conf again (it sorts before our .conflist).
		if err := os.WriteFile(conf, []byte(single), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInstallerConvertsNamelessConf: a single-plugin .conf without "name" is a valid network
// configuration for the runtime (libcni's ConfListFromConf gives its list the name ""), so the
// conflist it becomes must load too: libcni refuses a conflist without "name" ("no name"), which
// would leave the node without a network configuration.
func TestInstallerConvertsNamelessConf(t *testing.T) {
	in, _ := newInstaller(t)
	conf := filepath.Join(in.ConfDir, "05-single.conf")
	single := `{"cniVersion":"1.0.0","type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.1.0.0/16"}}`
	if err := os.WriteFile(conf, []byte(single), 0o644); err != nil {
		t.Fatal(err)
	}
	path, _, err := in.Ensure()
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		t.Fatalf("libcni cannot load the converted conflist: %v", err)
	}
	if list.Name != "" || len(list.Plugins) != 2 || list.Plugins[0].Network.Type != "bridge" || list.Plugins[1].Network.Type != plugin.PluginName {
		t.Errorf("conflist %q with plugins %+v; want \"\" [bridge aether-cni]", list.Name, list.Plugins)
	}
}

// TestInstallerRefusesBadSinglePluginConf: a .conf first in order that is not one plugin, or has
// a cniVersion aether-cni does not support, is an error naming the file, and nothing is written.
func TestInstallerRefusesBadSinglePluginConf(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"cniVersion":"0.3.1","name":"n"}`, "type"},
		{`{"cniVersion":"0.3.1","name":"n","plugins":[{"type":"bridge"}]}`, "type"},
		{`{"cniVersion":"0.1.0","name":"n","type":"bridge"}`, "cniVersion"},
	} {
		in, _ := newInstaller(t)
		conf := filepath.Join(in.ConfDir, "05-single.conf")
		if err := os.WriteFile(conf, []byte(c.body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := in.Ensure(); err == nil || !strings.Contains(err.Error(), "05-single.conf") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Ensure with %s first = %v, want an error naming the file and %s", c.body, err, c.want)
		}
		if b, err := os.ReadFile(conf); err != nil || string(b) != c.body {
			t.Errorf("%s changed: %q, %v", conf, b, err)
		}
		if _, err := os.Stat(filepath.Join(in.ConfDir, "05-single.conflist")); !os.IsNotExist(err) {
			t.Errorf("a conflist was written for %s", c.body)
		}
	}
}

// TestInstallerWatchRepairsRewrite rewrites the conflist without aether-cni the way a primary
// CNI does (in place, and by rename) and waits for the watcher to put aether-cni back; Changed
// is called once per write (the install and each repair), never for the watcher's own writes.
func TestInstallerWatchRepairsRewrite(t *testing.T) {
	in, path := newInstaller(t)
	var mu sync.Mutex
	var changed []string
	in.Changed = func(p string) { mu.Lock(); changed = append(changed, p); mu.Unlock() }
	calls := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(changed) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Watch(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			tp := pluginTypes(t, path)
			if len(tp) == 3 && tp[2] == plugin.PluginName && len(calls()) > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: conflist not repaired within 20s: %v", what, tp)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("initial install")
	start := time.Now()
	if err := os.WriteFile(path, []byte(flannelConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("in-place rewrite")
	tmp := filepath.Join(in.ConfDir, "flannel.tmp")
	_ = os.WriteFile(tmp, []byte(flannelConflist), 0o644)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor("rewrite by rename")
	t.Logf("two rewrites repaired in %v", time.Since(start))
	time.Sleep(500 * time.Millisecond) // the watcher sees its own last write
	if got := calls(); len(got) != 3 || got[0] != path || got[2] != path {
		t.Fatalf("Changed called with %v, want %s three times (install, two repairs)", got, path)
	}
}

func TestInstallerRejectsUnsupportedVersion(t *testing.T) {
	in, path := newInstaller(t)
	_ = os.WriteFile(path, []byte(strings.Replace(flannelConflist, "0.3.1", "0.2.0", 1)), 0o644)
	if _, _, err := in.Ensure(); err == nil || !strings.Contains(err.Error(), "0.2.0") {
		t.Fatalf("Ensure of a 0.2.0 conflist = %v, want an error naming the version", err)
	}
	if tp := pluginTypes(t, path); len(tp) != 2 {
		t.Fatalf("unsupported conflist was changed: %v", tp)
	}
}

// TestInstallerRefusesConflistWithoutPrimary: a conflist with no plugin for aether-cni to chain
// after (plugins empty, null or absent: a primary CNI half-way through writing it, a hand edit)
// is left as it is and named in the error. Before, Ensure appended aether-cni, turning a conflist
// the runtime refuses (node NetworkNotReady, no pods scheduled) into a valid one whose every ADD
// fails ("prevResult: missing"): the node turned Ready with no pod able to start on it.
func TestInstallerRefusesConflistWithoutPrimary(t *testing.T) {
	for name, plugins := range map[string]string{"empty": `, "plugins": []`, "null": `, "plugins": null`, "absent": ``} {
		t.Run(name, func(t *testing.T) {
			in, path := newInstaller(t)
			conf := []byte(`{"name": "cbr0", "cniVersion": "1.0.0"` + plugins + "}\n")
			if err := os.WriteFile(path, conf, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, changed, err := in.Ensure(); err == nil || changed || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "plugins") {
				t.Fatalf("Ensure = changed %v, %v; want an error naming %s and plugins", changed, err, path)
			}
			if b, _ := os.ReadFile(path); string(b) != string(conf) {
				t.Fatalf("conflist changed to %s", b)
			}
		})
	}
}
