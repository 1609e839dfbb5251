package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/atomicfile"
)

// Installer puts aether-cni on a node: the binary into the CNI bin directory and an aether-cni
// entry at the end of the primary CNI's conflist (the Flannel one), and keeps it there when the
// primary CNI rewrites the file. It never changes the rest of the conflist: every other key and
// plugin entry keeps its value (keys may be re-ordered and re-indented).
type Installer struct {
	// ConfDir is the runtime's CNI config directory (/etc/cni/net.d).
	ConfDir string
	// BinDir is the CNI plugin directory (/opt/cni/bin).
	BinDir string
	// Binary is the aether-cni binary to copy into BinDir (empty: skip the binary).
	Binary string
	// Plugin is aether-cni's conflist entry; "type" is set to PluginName.
	Plugin map[string]any
	// Changed, when set, is called by Watch each time Ensure wrote aether-cni into the conflist
	// (at first install, and each time a primary CNI rewrote its conflist without it): sandboxes
	// set up before that ran the primary CNI alone, and the caller looks for them.
	Changed func(path string)
	Log     *slog.Logger
}

func (in *Installer) log() *slog.Logger {
	if in.Log != nil {
		return in.Log
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// InstallBinary copies Binary to BinDir/aether-cni atomically (temporary file and rename, mode
// 0755), so a runtime never executes a half-written plugin.
func (in *Installer) InstallBinary() error {
	if in.Binary == "" {
		return nil
	}
	b, err := os.ReadFile(in.Binary)
	if err != nil {
		return fmt.Errorf("install plugin binary: %w", err)
	}
	if err := os.MkdirAll(in.BinDir, 0o755); err != nil {
		return fmt.Errorf("install plugin binary: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(in.BinDir, plugin.PluginName), b, 0o755); err != nil {
		return fmt.Errorf("install plugin binary: %w", err)
	}
	return nil
}

// PrimaryConfig returns the network configuration file the runtime uses: the first file in
// lexical order among ConfDir's *.conflist, *.conf and *.json (the order kubelet/containerd's
// libcni ConfFiles gives). It may be a single-plugin .conf or .json, which Ensure turns into a
// conflist. It returns "" when there is none yet.
func (in *Installer) PrimaryConfig() (string, error) {
	ents, err := os.ReadDir(in.ConfDir)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("find primary network config: %w", err)
	}
	var names []string
	for _, e := range ents {
		ext := filepath.Ext(e.Name())
		if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") && (ext == ".conflist" || ext == ".conf" || ext == ".json") {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return "", nil
	}
	slices.Sort(names)
	return filepath.Join(in.ConfDir, names[0]), nil
}

// toConflist turns the single-plugin network configuration at path (a .conf or .json: one
// plugin's object with "type", CNI spec 1.1 section "Configuration format" as libcni's
// ConfListFromConf reads it) into a conflist of that one plugin, <base>.conflist beside it, and
// removes the original, as Istio's install-cni does for a primary CNI (Multus's 00-multus.conf,
// for one) that writes a single plugin: only a conflist can chain. The conflist takes the
// original's name ("" when it has none, as libcni's ConfListFromConf), cniVersion and mode; the
// plugin keeps every other key. A <base>.conflist already there is replaced (the .conf sorted
// first, so it was the one in use). It returns the conflist's path, and an error naming the file
// when it is not a single plugin or its cniVersion is one aether-cni does not support; then
// nothing is written.
func (in *Installer) toConflist(path string) (string, error) {
	top, plugins, mode, err := readConflist(path)
	if err != nil {
		return "", err
	}
	var typ, ver string
	_ = json.Unmarshal(top["type"], &typ)
	_ = json.Unmarshal(top["cniVersion"], &ver)
	if typ == "" || plugins != nil {
		return "", fmt.Errorf("convert %s to a conflist: type: missing; a .conf or .json network config is one plugin with a type", path)
	}
	if !slices.Contains(plugin.SupportedVersions, ver) {
		return "", fmt.Errorf("convert %s to a conflist: cniVersion %q: %s supports %s", path, ver, plugin.PluginName, strings.Join(plugin.SupportedVersions, ", "))
	}
	// A conflist must have a name (libcni's NetworkConfFromBytes refuses one without); a .conf
	// without one is valid and its list gets the name "" (libcni's ConfListFromConf).
	list := map[string]json.RawMessage{"cniVersion": top["cniVersion"], "name": json.RawMessage(`""`)}
	if n, ok := top["name"]; ok {
		list["name"] = n
	}
	delete(top, "cniVersion")
	one, err := json.Marshal(top)
	if err != nil {
		return "", fmt.Errorf("convert %s to a conflist: %w", path, err)
	}
	out := strings.TrimSuffix(path, filepath.Ext(path)) + ".conflist"
	if err := writeConflist(out, list, []json.RawMessage{one}, mode); err != nil {
		return "", err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("convert %s to a conflist: %w", path, err)
	}
	in.log().Info("single-plugin network config turned into a conflist", "from", path, "to", out)
	return out, nil
}

func (in *Installer) entry() map[string]any {
	e := map[string]any{}
	for k, v := range in.Plugin {
		e[k] = v
	}
	e["type"] = plugin.PluginName
	return e
}

// Ensure makes the primary conflist end with the aether-cni entry (a single-plugin .conf or
// .json first in order becomes a conflist first, see toConflist): it appends it when missing,
// replaces an aether-cni entry that differs, and writes nothing when it is already right. It
// writes atomically (temporary file and rename, keeping the file's mode). It returns the file
// and whether it changed it; ("", false, nil) when no conflist exists yet; an error when the
// conflist's cniVersion is one aether-cni does not support (every ADD would fail) or it has no
// plugin other than aether-cni (nothing to chain after: every ADD would fail for want of a
// prevResult, where the runtime would otherwise keep the node NetworkNotReady).
func (in *Installer) Ensure() (path string, changed bool, err error) {
	path, err = in.PrimaryConfig()
	if err != nil || path == "" {
		return path, false, err
	}
	converted := false
	if filepath.Ext(path) != ".conflist" {
		list, err := in.toConflist(path)
		if err != nil {
			return path, false, err
		}
		path, converted = list, true
	}
	top, plugins, mode, err := readConflist(path)
	if err != nil {
		return path, false, err
	}
	var ver string
	_ = json.Unmarshal(top["cniVersion"], &ver)
	if !slices.Contains(plugin.SupportedVersions, ver) {
		return path, false, fmt.Errorf("ensure conflist %s: cniVersion %q: %s supports %s", path, ver, plugin.PluginName, strings.Join(plugin.SupportedVersions, ", "))
	}
	want := in.entry()
	var kept []json.RawMessage
	ok, primary := false, false
	for i, p := range plugins {
		var v map[string]any
		if json.Unmarshal(p, &v) != nil || v["type"] != plugin.PluginName {
			kept = append(kept, p)
			primary = true
			continue
		}
		if i == len(plugins)-1 && reflect.DeepEqual(v, roundTrip(want)) {
			ok = true
			kept = append(kept, p)
		}
	}
	if !primary {
		// The runtime refuses such a conflist (the node stays NetworkNotReady); aether-cni alone
		// would make it valid with every ADD failing for want of a prevResult.
		return path, false, fmt.Errorf("ensure conflist %s: plugins: no plugin for %s to chain after (the primary CNI has not written its plugins yet?)", path, plugin.PluginName)
	}
	if ok && len(kept) == len(plugins) {
		return path, converted, nil
	}
	if !ok {
		b, err := json.Marshal(want)
		if err != nil {
			return path, false, fmt.Errorf("ensure conflist: %w", err)
		}
		kept = append(kept, b)
	}
	if err := writeConflist(path, top, kept, mode); err != nil {
		return path, false, err
	}
	in.log().Info("aether-cni added to the conflist", "path", path)
	return path, true, nil
}

// Uninstall removes every aether-cni entry from the conflists in ConfDir (leaving the rest of
// each file as it was) and the binary from BinDir. Missing pieces are success.
func (in *Installer) Uninstall() error {
	ents, err := os.ReadDir(in.ConfDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("uninstall: %w", err)
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".conflist" || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(in.ConfDir, e.Name())
		top, plugins, mode, err := readConflist(path)
		if err != nil {
			return err
		}
		kept := slices.DeleteFunc(slices.Clone(plugins), func(p json.RawMessage) bool {
			var v struct {
				Type string `json:"type"`
			}
			return json.Unmarshal(p, &v) == nil && v.Type == plugin.PluginName
		})
		if len(kept) == len(plugins) {
			continue
		}
		if err := writeConflist(path, top, kept, mode); err != nil {
			return err
		}
	}
	if in.BinDir != "" {
		if err := os.Remove(filepath.Join(in.BinDir, plugin.PluginName)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("uninstall: %w", err)
		}
	}
	return nil
}

// Watch ensures the conflist now and again after every change in ConfDir (fsnotify, debounced
// by 100 ms), so a primary CNI that rewrites its conflist without aether-cni gets it back, and
// calls Changed after each write. It returns when ctx ends (nil) or the watcher fails.
func (in *Installer) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch CNI config: %w", err)
	}
	defer w.Close()
	if err := os.MkdirAll(in.ConfDir, 0o755); err != nil {
		return fmt.Errorf("watch CNI config: %w", err)
	}
	if err := w.Add(in.ConfDir); err != nil {
		return fmt.Errorf("watch CNI config: %w", err)
	}
	ensure := func() {
		path, changed, err := in.Ensure()
		if err != nil {
			in.log().Error("ensure conflist", "err", err)
			return
		}
		if changed && in.Changed != nil {
			in.Changed(path)
		}
	}
	ensure()
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("watch CNI config: watcher closed")
			}
			if strings.HasPrefix(filepath.Base(ev.Name), ".") {
				continue // our own temporary files
			}
			debounce = time.After(100 * time.Millisecond)
		case err, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("watch CNI config: watcher closed")
			}
			in.log().Warn("watch CNI config", "err", err)
		case <-debounce:
			debounce = nil
			ensure()
		}
	}
}

func readConflist(path string) (map[string]json.RawMessage, []json.RawMessage, os.FileMode, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("read conflist: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("read conflist: %w", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, nil, 0, fmt.Errorf("read conflist %s: %w", path, err)
	}
	var plugins []json.RawMessage
	if raw, ok := top["plugins"]; ok {
		if err := json.Unmarshal(raw, &plugins); err != nil {
			return nil, nil, 0, fmt.Errorf("read conflist %s: plugins: %w", path, err)
		}
	}
	return top, plugins, st.Mode().Perm(), nil
}

func writeConflist(path string, top map[string]json.RawMessage, plugins []json.RawMessage, mode os.FileMode) error {
	pb, err := json.Marshal(plugins)
	if err != nil {
		return fmt.Errorf("write conflist: %w", err)
	}
	top["plugins"] = pb
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(top); err != nil {
		return fmt.Errorf("write conflist: %w", err)
	}
	if err := atomicfile.Write(path, buf.Bytes(), mode); err != nil {
		return fmt.Errorf("write conflist %s: %w", path, err)
	}
	return nil
}

// roundTrip returns v as encoding/json would decode it back (numbers as float64), for comparing
// a wanted entry with one read from a file.
func roundTrip(v map[string]any) map[string]any {
	b, _ := json.Marshal(v)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}
