package plugin

import (
	"bytes"
	"slices"
	"testing"

	"github.com/containernetworking/cni/pkg/version"
)

// TestAnswerVersion pins the VERSION answer (CNI spec 1.1, "Version"): cniVersion echoes the
// input, supportedVersions lists every accepted version, and libcni's decoder reads it.
func TestAnswerVersion(t *testing.T) {
	for in, want := range map[string]string{
		`{"cniVersion":"0.3.1"}`: "0.3.1",
		`{"cniVersion":"1.0.0"}`: "1.0.0",
		`{"cniVersion":"1.1.0"}`: "1.1.0",
		``:                       "1.1.0",
		`{}`:                     "1.1.0",
		`not json`:               "1.1.0",
	} {
		var out bytes.Buffer
		if err := AnswerVersion([]byte(in)).Encode(&out); err != nil {
			t.Fatal(err)
		}
		info, err := (&version.PluginDecoder{}).Decode(out.Bytes())
		if err != nil {
			t.Fatalf("input %q: decode %s: %v", in, out.Bytes(), err)
		}
		if !slices.Equal(info.SupportedVersions(), SupportedVersions) {
			t.Errorf("input %q: supportedVersions %v, want %v", in, info.SupportedVersions(), SupportedVersions)
		}
		if got := AnswerVersion([]byte(in)).CNIVersion; got != want {
			t.Errorf("input %q: cniVersion %q, want %q", in, got, want)
		}
	}
}
