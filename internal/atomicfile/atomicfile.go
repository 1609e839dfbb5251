// Package atomicfile writes files so that a crash or power loss leaves either the old content or
// the new, never a mix: the node agent's state (CNI attachments, routed UDP frontends, the last
// known registry state) and the files it installs (the CNI plugin, the conflist). It owns no
// file's format.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes b to path with mode through a temporary file in the same directory (fsync'ed,
// then renamed over path) and fsyncs the directory, so the rename itself survives a crash. The
// directory must exist. It returns the first error; the temporary file is removed on failure.
func Write(path string, b []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
