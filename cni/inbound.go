package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/internal/atomicfile"
)

// PodInbound is one pod's inbound mTLS policy, the data-plane half of a PeerAuthentication-like
// policy (docs/capture.md, per-pod and per-port modes): Mode overrides the node default (""
// keeps it: the plugin config's inboundMode, else ServerConfig.Mode); StrictPorts are refused in
// plaintext when the pod's mode is permissive (capture.Config.StrictPorts), PermissivePorts
// accepted in plaintext when it is strict (capture.Config.PermissivePorts). Ports are TCP
// (container) ports; the list not matching the pod's mode is ignored, so one policy can say
// "this port strict, that one permissive" whatever the node default is.
type PodInbound struct {
	Mode            capture.Mode `json:"mode,omitempty"`
	StrictPorts     []uint16     `json:"strictPorts,omitempty"`
	PermissivePorts []uint16     `json:"permissivePorts,omitempty"`
}

// normalized returns p with its port lists sorted and de-duplicated (nil when empty), so two
// policies that capture the same are equal.
func (p PodInbound) normalized() PodInbound {
	norm := func(in []uint16) []uint16 {
		if len(in) == 0 {
			return nil
		}
		out := slices.Clone(in)
		slices.Sort(out)
		return slices.Compact(out)
	}
	return PodInbound{Mode: p.Mode, StrictPorts: norm(p.StrictPorts), PermissivePorts: norm(p.PermissivePorts)}
}

// isDefault reports whether p changes nothing of the node default (as if the pod had no entry).
func (p PodInbound) isDefault() bool {
	return p.Mode == "" && len(p.StrictPorts) == 0 && len(p.PermissivePorts) == 0
}

func (p PodInbound) equal(o PodInbound) bool {
	return p.Mode == o.Mode && slices.Equal(p.StrictPorts, o.StrictPorts) && slices.Equal(p.PermissivePorts, o.PermissivePorts)
}

// validInbound validates and normalizes a set of policies keyed by pod UID against the port
// plan of a node whose resolver listens on dnsPort (0: the default); entries that change nothing
// are dropped. An entry it cannot take fails closed, alone: an invalid policy becomes strict
// (every port, no exception) and an invalid pod UID is left out; the error names each, with the
// field and the value (capture.Config.ValidInbound). One pod's bad entry (a port of aether's
// own, say) never stops the others' updates.
func validInbound(m map[string]PodInbound, dnsPort uint16) (map[string]PodInbound, error) {
	out := make(map[string]PodInbound, len(m))
	var errs []error
	for _, uid := range slices.Sorted(maps.Keys(m)) {
		if err := validKeyPart("pod UID", uid); err != nil {
			errs = append(errs, fmt.Errorf("inbound policy: %w", err))
			continue
		}
		p := m[uid].normalized()
		c := capture.Config{Mode: p.Mode, StrictPorts: p.StrictPorts, PermissivePorts: p.PermissivePorts, DNSPort: dnsPort}
		if err := c.ValidInbound(); err != nil {
			errs = append(errs, fmt.Errorf("inbound policy of pod UID %s (made strict): %w", uid, err))
			p = PodInbound{Mode: capture.ModeStrict}
		}
		if !p.isDefault() {
			out[uid] = p
		}
	}
	return out, errors.Join(errs...)
}

// inboundOf returns the policy of the pod with uid (the zero PodInbound: the node default).
func (s *Server) inboundOf(uid string) PodInbound {
	if uid == "" {
		return PodInbound{}
	}
	s.inMu.Lock()
	defer s.inMu.Unlock()
	if s.inStrictAll && !s.inSet {
		return PodInbound{Mode: capture.ModeStrict}
	}
	return s.inbound[uid]
}

// SetInboundPolicies replaces the per-pod inbound policies, keyed by pod UID (a pod not in m
// gets the node default), as a whole. It validates every entry first; an invalid one is an
// error naming the pod UID, the field and the value, and nothing of m is taken. Otherwise it
// persists m in StateDir (inboundStateFile: 0600, atomic) before any pod sees it, so a restarted
// agent repairs with the policy its pods last had and never opens a pod it had closed; then it
// re-applies the capture rules of every captured pod whose policy changed (and of those a
// previous call did not reach), not of the others, and returns the joined errors of the pods it
// could not update and of the persisting. The caller retries with the same set until it
// returns nil (a set equal to the current one is then a no-op); the periodic repair converges
// too. Pods added after the call get their policy at ADD (an ADD racing the call is caught by a
// repair pass it requests). A caller's connection the new policy refuses (a plaintext one, when
// its pod or port turns strict) is cut: the rules judge every packet of a caller, not only the
// first (capture.Build), and the pod's end is closed (capture.CutRefused).
func (s *Server) SetInboundPolicies(ctx context.Context, m map[string]PodInbound) error {
	s.defaults()
	want, err := validInbound(m, s.Config.DNSPort)
	if err != nil {
		// The set is taken with those entries failed closed: a retry would not change them.
		s.Log.Error("inbound policies refused for some pods: they are strict", "err", err)
	}
	s.inSetMu.Lock()
	defer s.inSetMu.Unlock()
	// Compared with what the pods may have: a set given before Serve started is compared with
	// the persisted one, so a pod whose policy it drops is updated too.
	s.loadInbound()
	s.inMu.Lock()
	changed := maps.Clone(s.inDirty)
	if changed == nil {
		changed = map[string]bool{}
	}
	for uid, p := range want {
		if !p.equal(s.inbound[uid]) {
			changed[uid] = true
		}
	}
	for uid := range s.inbound {
		if _, ok := want[uid]; !ok {
			changed[uid] = true
		}
	}
	unsaved := s.inUnsaved
	s.inSet = true
	s.inMu.Unlock()
	if len(changed) == 0 && !unsaved {
		return nil
	}
	var errs []error
	// Persist first: a restart between the two must not find an older, more open, set.
	saveErr := s.saveInbound(want)
	if saveErr != nil {
		// The pods get the set all the same; the retry persists it.
		s.Log.Error("persist inbound policies", "err", saveErr)
		errs = append(errs, fmt.Errorf("persist inbound policies: %w", saveErr))
	}
	s.inMu.Lock()
	s.inbound, s.inDirty, s.inUnsaved = want, changed, saveErr != nil
	s.inMu.Unlock()
	if len(changed) > 0 {
		s.Log.Info("inbound policies changed: re-applying capture rules", "pods", len(changed), "policies", len(want))
	}
	recs, err := s.store.List()
	if err != nil {
		errs = append(errs, err)
	}
	for _, r := range recs {
		if !r.Captured || !changed[r.Attachment.PodUID] {
			continue
		}
		if err := s.reapply(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("apply inbound policy to %s/%s: %w", r.Attachment.Namespace, r.Attachment.Name, err))
		}
	}
	s.RequestRepair()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	s.inMu.Lock()
	s.inDirty = nil
	s.inMu.Unlock()
	return nil
}

// reapply re-applies the capture rules of a captured record under its lock; a record deleted
// meanwhile or whose netns is gone is skipped (repair releases it).
func (s *Server) reapply(ctx context.Context, r *Record) error {
	defer s.lock(r.Key())()
	cur, err := s.store.Load(r.Attachment.ContainerID, r.Attachment.Interface)
	if err != nil || cur == nil || !cur.Captured {
		return err
	}
	if _, err := os.Stat(cur.Attachment.NetnsPath); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	changed, err := s.applyRules(cur)
	if changed {
		s.Log.Info("inbound policy applied", "pod", cur.Attachment.Namespace+"/"+cur.Attachment.Name)
	}
	return err
}

// inboundStateFile, in StateDir, holds the last per-pod inbound policies (SetInboundPolicies) as
// JSON, {"version":1,"pods":{"<pod UID>":{"mode":"permissive","strictPorts":[8080]}}}. Its name
// is not a Record's (no ".json").
const inboundStateFile = "inbound-policies"

// inboundFile is inboundStateFile's content.
type inboundFile struct {
	Version int                   `json:"version"`
	Pods    map[string]PodInbound `json:"pods"`
}

// saveInbound persists m (inboundStateFile).
func (s *Server) saveInbound(m map[string]PodInbound) error {
	b, err := json.Marshal(inboundFile{Version: 1, Pods: m})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Config.StateDir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(s.Config.StateDir, inboundStateFile), b, 0o600)
}

// loadInbound sets the per-pod inbound policies from inboundStateFile (LoadInboundPolicies),
// once, unless SetInboundPolicies has set them. A file it cannot take is logged and refused:
// A file that cannot be read at all makes every pod strict until the agent sets the policies
// (inStrictAll: the pods it had closed stay closed); entries that cannot be taken make their pods
// strict (validInbound).
func (s *Server) loadInbound() {
	s.inMu.Lock()
	done := s.inLoaded || s.inSet
	s.inMu.Unlock()
	if done {
		return
	}
	m, err := LoadInboundPolicies(s.Config.StateDir, s.Config.DNSPort)
	s.inMu.Lock()
	defer s.inMu.Unlock()
	if s.inLoaded || s.inSet {
		return // the agent's set came first: it is newer
	}
	s.inLoaded = true
	if err != nil && m == nil {
		// Which pods the file made strict is unknown: all of them are, until the agent sets
		// the policies (never more open than before the restart).
		s.inStrictAll = true
		s.Log.Error("persisted inbound policies refused: every pod is strict until the policies are set again", "err", err)
		return
	}
	if err != nil {
		s.Log.Error("persisted inbound policies: some entries refused, those pods are strict", "err", err)
	}
	s.inbound = m
	if len(m) > 0 {
		s.Log.Info("persisted inbound policies loaded", "policies", len(m))
	}
}

// LoadInboundPolicies returns the per-pod inbound policies persisted in stateDir (the last
// SetInboundPolicies of a Server on it), keyed by pod UID; none when there is no file. A file
// that does not parse or has another version than 1 is an error naming the file, with no
// policies; entries SetInboundPolicies would not take on a node whose resolver listens on dnsPort
// (0: the default) come back failed closed (validInbound) with an error naming the file, the pod
// UID, the field and the value.
func LoadInboundPolicies(stateDir string, dnsPort uint16) (map[string]PodInbound, error) {
	path := filepath.Join(stateDir, inboundStateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var f inboundFile
	if err == nil {
		err = json.Unmarshal(b, &f)
	}
	if err == nil && f.Version != 1 {
		err = fmt.Errorf("version %d: want 1", f.Version)
	}
	if err != nil {
		return nil, fmt.Errorf("inbound policies in %s: %w", path, err)
	}
	m, err := validInbound(f.Pods, dnsPort)
	if err != nil {
		return m, fmt.Errorf("inbound policies in %s: %w", path, err)
	}
	return m, nil
}
