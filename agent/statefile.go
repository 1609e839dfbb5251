package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/internal/atomicfile"
)

// The agent's last-known registry state (docs/agent.md, "Last-known registry state"): the
// registry view (endpoints, export marks) and the imported config projections, each in a file
// under <state-dir>/registry/ (a directory: the CNI store reads every *.json directly in
// --state-dir as an attachment). They let an agent restarted while the registry is cut off serve
// what it served before. Root-owned, 0600, in a 0700 directory.
const (
	stateSubdir = "registry"
	// viewStateFile holds the registry view (registryView), written at most every
	// viewPersistInterval while the view is live.
	viewStateFile = "view.json"
	// configStateFile holds the config projections the agent imports (configImport).
	configStateFile = "config-projections.json"
	// stateFormat is the format written; a file of a higher format (a newer agent's, after a
	// rollback) is ignored, never guessed at.
	stateFormat = 1
	// maxStateFileBytes bounds what the agent reads back (a clusterset of 100,000 endpoints
	// takes about 70 MB): a larger file is ignored rather than loaded.
	maxStateFileBytes = 256 << 20
)

// registryState is the content of a state file: registry records exactly as the store holds
// them (key and protobuf value), so that loading them runs the checks the registry's readers
// run (registry.DecodeEndpoint and the like: origin from the key path, validation).
type registryState struct {
	Format int `json:"format"`
	// Kind is viewStateFile's "registry-view" or configStateFile's "config-projections".
	Kind string `json:"kind"`
	// Cluster is the writing agent's --cluster: a file of another cluster is ignored.
	Cluster string `json:"cluster"`
	// Written is when the records were written (they changed then).
	Written time.Time      `json:"written"`
	Records []storedRecord `json:"records"`
}

// storedRecord is one registry record: its key and its value in protobuf wire format (base64 in
// the JSON).
type storedRecord struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// stateFile reads and writes one state file. Not safe for concurrent use (one writer each).
type stateFile struct {
	path    string
	kind    string
	cluster string
	// last is the encoding of the records last written or loaded: save writes only when they
	// change.
	last []byte
}

// newStateFile returns the state file name (viewStateFile, configStateFile) under stateDir's
// registry directory, holding records of kind for cluster.
func newStateFile(stateDir, name, kind, cluster string) *stateFile {
	return &stateFile{path: filepath.Join(stateDir, stateSubdir, name), kind: kind, cluster: cluster}
}

// storeRecord returns a record's key and deterministic protobuf encoding.
func storeRecord(key string, m proto.Message) (storedRecord, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return storedRecord{}, fmt.Errorf("encode %s: %w", key, err)
	}
	return storedRecord{Key: key, Value: b}, nil
}

// save writes recs (in any order; sorted by key here) atomically, mode 0600, when they differ
// from what the file last held; it reports whether it wrote.
func (f *stateFile) save(recs []storedRecord, now time.Time) (bool, error) {
	slices.SortFunc(recs, func(a, b storedRecord) int { return strings.Compare(a.Key, b.Key) })
	if recs == nil {
		recs = []storedRecord{}
	}
	body, err := json.Marshal(recs)
	if err != nil {
		return false, fmt.Errorf("write %s: %w", f.path, err)
	}
	if f.last != nil && bytes.Equal(body, f.last) {
		return false, nil
	}
	b, err := json.Marshal(registryState{Format: stateFormat, Kind: f.kind, Cluster: f.cluster, Written: now.UTC(), Records: recs})
	if err != nil {
		return false, fmt.Errorf("write %s: %w", f.path, err)
	}
	if err := os.MkdirAll(filepath.Dir(f.path), 0o700); err != nil {
		return false, fmt.Errorf("write %s: %w", f.path, err)
	}
	if err := atomicfile.Write(f.path, b, 0o600); err != nil {
		return false, fmt.Errorf("write %s: %w", f.path, err)
	}
	f.last = body
	return true, nil
}

// errNoState is load's error when there is no file.
var errNoState = errors.New("no persisted state")

// load reads the file. It returns errNoState when there is none, and an error naming the file
// and the problem for one it will not use: unreadable, larger than maxStateFileBytes, not
// JSON, of a newer format, of another kind or of another cluster. The records themselves are
// not decoded here.
func (f *stateFile) load() (*registryState, error) {
	fh, err := os.Open(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errNoState
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", f.path, err)
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxStateFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", f.path, err)
	}
	if len(b) > maxStateFileBytes {
		return nil, fmt.Errorf("read %s: larger than %d bytes", f.path, maxStateFileBytes)
	}
	var st registryState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("read %s: not a state file: %w", f.path, err)
	}
	switch {
	case st.Format > stateFormat:
		return nil, fmt.Errorf("read %s: format %d, written by a newer agent (this one reads format %d)", f.path, st.Format, stateFormat)
	case st.Format < 1:
		return nil, fmt.Errorf("read %s: format %d: not a state file", f.path, st.Format)
	case st.Kind != f.kind:
		return nil, fmt.Errorf("read %s: kind %q, want %q", f.path, st.Kind, f.kind)
	case st.Cluster != f.cluster:
		return nil, fmt.Errorf("read %s: written for cluster %q, this agent's --cluster is %q", f.path, st.Cluster, f.cluster)
	}
	if body, err := json.Marshal(st.Records); err == nil {
		f.last = body
	}
	return &st, nil
}
