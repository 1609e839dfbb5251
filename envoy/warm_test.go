package envoy

import (
	"regexp"
	"strings"
	"testing"

	"github.com/aethermesh/aether/model"
)

// TestNameFilter: the config dump filter of WaitListenersWarm matches every listener it waits
// for and always fits Envoy's default RE2 program size limit (100), which the admin API enforces
// on name_regex: a pod of a Deployment in a long namespace (names up to 63 characters each) once
// made the dump answer 400 and the pod was never accepted. Short names keep the exact
// alternation.
func TestNameFilter(t *testing.T) {
	pod := func(ns, name string) []string {
		k := ns + "/" + name
		return []string{"capture|" + k, "lane|" + k, "inbound|" + k}
	}
	long63 := strings.Repeat("a", 40) + "-7d9f8c6b5d-x2x9k" + strings.Repeat("z", 6)
	for _, tc := range []struct {
		name  string
		names []string
		exact bool
	}{
		{"short pod", pod("shop", "echo-1"), true},
		{"deployment pod", pod("shop", "survivor-84c554dc4f-ngmgh"), false},
		{"63-character names", pod(strings.Repeat("n", 63), long63), false},
		{"one listener", []string{"capture|shop/echo-1"}, true},
		{"nothing shared", []string{strings.Repeat("x", 80) + "1", strings.Repeat("y", 80) + "2"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			re := nameFilter(tc.names)
			if re == "" {
				if tc.exact {
					t.Fatal("no filter for names that fit")
				}
				return // the whole dump, filtered by name in Go
			}
			size, err := model.RE2ProgramSize(re)
			if err != nil || size > maxAdminRegex {
				t.Fatalf("filter %q: program size %d (%v), want at most %d", re, size, err, maxAdminRegex)
			}
			for _, n := range tc.names {
				if !regexp.MustCompile(re).MatchString(n) {
					t.Errorf("filter %q does not match %q", re, n)
				}
			}
			if got := strings.HasPrefix(re, "^("); got != tc.exact {
				t.Errorf("filter %q: exact alternation %v, want %v", re, got, tc.exact)
			}
		})
	}
}
