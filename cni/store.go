package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	"github.com/aethermesh/aether/internal/atomicfile"

	"github.com/aethermesh/aether/model"
)

// Record is one attachment as the agent persists it in its node-local state directory: the
// PodAttachment (so repair after an agent restart knows the netns path) plus what the agent needs
// to rebuild the pod's capture rules.
type Record struct {
	Network    string               `json:"network"`
	Attachment cniv1.PodAttachment  `json:"attachment"`
	Gateways   []netip.Addr         `json:"gateways,omitempty"`
	Capture    cniv1.CaptureOptions `json:"capture"`
	// Captured is false for a pod the agent left alone (not meshed); Reason says why.
	Captured bool   `json:"captured"`
	Reason   string `json:"reason,omitempty"`
	// ServiceAccount and Ports are the pod's metadata at ADD time (from the API server).
	ServiceAccount string          `json:"serviceAccount,omitempty"`
	Ports          []model.PodPort `json:"ports,omitempty"`
	// ProbePorts are the pod's kubelet probe ports at ADD time (pod probes are immutable), the
	// only ports strict capture opens to the node. ProbesRecorded is false in a record an older
	// agent wrote: its pod is read again on repair to learn them, and until that succeeds its
	// capture trusts the node on every port, as that agent's did (capture.Config.NodeAllPorts).
	ProbePorts     []uint16  `json:"probePorts,omitempty"`
	ProbesRecorded bool      `json:"probesRecorded,omitempty"`
	Added          time.Time `json:"added"`
}

// Key returns the record's file name stem: "<containerID>_<ifname>" (CNI identifies an
// attachment by the pair).
func (r *Record) Key() string { return attachmentKey(r.Attachment.ContainerID, r.Attachment.Interface) }

func attachmentKey(containerID, ifname string) string { return containerID + "_" + ifname }

// LocalPod returns the record as the model's LocalPod.
func (r *Record) LocalPod() model.LocalPod {
	a := r.Attachment
	return model.LocalPod{UID: a.PodUID, Namespace: a.Namespace, Name: a.Name, ServiceAccount: r.ServiceAccount,
		ContainerID: a.ContainerID, NetnsPath: a.NetnsPath, IPs: a.IPs, Ports: r.Ports}
}

// Store keeps Records as one JSON file each in Dir, written atomically (temporary file, fsync,
// rename, fsync of the directory), so a crash leaves either the old or the new record.
type Store struct {
	Dir string
}

// validKeyPart rejects container IDs and interface names that could escape Dir.
func validKeyPart(field, s string) error {
	if s == "" || strings.ContainsAny(s, "/\\\x00") || s == "." || s == ".." || len(s) > 200 {
		return fmt.Errorf("%s %q: want a non-empty name without slashes", field, s)
	}
	return nil
}

func (s *Store) path(key string) string { return filepath.Join(s.Dir, key+".json") }

// Save writes r atomically.
func (s *Store) Save(r *Record) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("save attachment: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("save attachment: %w", err)
	}
	if err := atomicfile.Write(s.path(r.Key()), b, 0o600); err != nil {
		return fmt.Errorf("save attachment %s: %w", r.Key(), err)
	}
	return nil
}

// Load returns the record of an attachment, or (nil, nil) when there is none.
func (s *Store) Load(containerID, ifname string) (*Record, error) {
	b, err := os.ReadFile(s.path(attachmentKey(containerID, ifname)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load attachment: %w", err)
	}
	r := &Record{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("load attachment %s: %w", containerID, err)
	}
	return r, nil
}

// Delete removes an attachment's record; a missing record is success.
func (s *Store) Delete(containerID, ifname string) error {
	if err := os.Remove(s.path(attachmentKey(containerID, ifname))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete attachment: %w", err)
	}
	return nil
}

// ForContainer returns the records of one container's attachments (any interface). Unreadable
// files are skipped and reported in the error, as List does.
func (s *Store) ForContainer(containerID string) ([]*Record, error) {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list attachments of %s: %w", containerID, err)
	}
	var out []*Record
	var errs []error
	for _, e := range ents {
		// attachmentKey joins with "_", and container IDs may hold "_": the prefix only
		// narrows the files to read, the record's own container ID decides.
		if e.IsDir() || !strings.HasPrefix(e.Name(), containerID+"_") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		r, err := s.readFile(filepath.Join(s.Dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r.Attachment.ContainerID == containerID {
			out = append(out, r)
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("list attachments of %s: %w", containerID, errors.Join(errs...))
	}
	return out, nil
}

func (s *Store) readFile(path string) (*Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := &Record{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return r, nil
}

// List returns every record in Dir. Unreadable files are skipped and reported in the error
// (joined), so one corrupt file never hides the others.
func (s *Store) List() ([]*Record, error) {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list attachments: %w", err)
	}
	var out []*Record
	var errs []error
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		r, err := s.readFile(filepath.Join(s.Dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, r)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("list attachments: %w", errors.Join(errs...))
	}
	return out, nil
}
