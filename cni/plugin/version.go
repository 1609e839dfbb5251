package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// VersionInfo is aether-cni's answer to CNI_COMMAND=VERSION (CNI spec 1.1, section "Version"):
// the cniVersion specified on input and the versions the plugin supports. It implements
// github.com/containernetworking/cni/pkg/version.PluginInfo.
type VersionInfo struct {
	// CNIVersion is the value of cniVersion specified on input (the spec's requirement).
	CNIVersion string `json:"cniVersion"`
	// Supported is SupportedVersions.
	Supported []string `json:"supportedVersions"`
}

// Encode writes the answer as one JSON object.
func (v VersionInfo) Encode(w io.Writer) error {
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return fmt.Errorf("encode version answer: %w", err)
	}
	return nil
}

// SupportedVersions returns the supported spec versions.
func (v VersionInfo) SupportedVersions() []string { return v.Supported }

// latestVersion is the newest version aether-cni speaks, answered when the input names none.
const latestVersion = "1.1.0"

// AnswerVersion builds the VERSION answer for the request on stdin ({"cniVersion": "..."}):
// cniVersion echoes the input's, as the spec says; skel's own VERSION answer instead always
// names its library's current version, whatever the input said. Empty or undecodable input (a
// runtime may send none) is answered with the newest supported version, 1.1.0.
func AnswerVersion(stdin []byte) VersionInfo {
	var in struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(stdin, &in); err != nil || in.CNIVersion == "" {
		in.CNIVersion = latestVersion
	}
	return VersionInfo{CNIVersion: in.CNIVersion, Supported: SupportedVersions}
}

// ServeVersion answers CNI_COMMAND=VERSION: it reads the request from stdin unless stdin is a
// character device (a terminal or /dev/null, where a manual run would otherwise wait), and
// writes AnswerVersion's result to stdout.
func ServeVersion(stdin *os.File, stdout io.Writer) error {
	var req []byte
	if st, err := stdin.Stat(); err == nil && st.Mode()&os.ModeCharDevice == 0 {
		if req, err = io.ReadAll(stdin); err != nil {
			return fmt.Errorf("read version request: %w", err)
		}
	}
	return AnswerVersion(req).Encode(stdout)
}
