package registrar_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestRBACMarkersMatchManifest checks that deploy/registrar/rbac.yaml grants exactly what the
// +kubebuilder:rbac markers in registrar/ declare: the ClusterRole holds the cluster-wide markers,
// the Role in aether-system the ones with namespace=aether-system. (The two-cluster tests run the
// registrar with this RBAC, so a marker missing from both would fail them.)
func TestRBACMarkersMatchManifest(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	marker := regexp.MustCompile(`^// \+kubebuilder:rbac:(.*)$`)
	want := map[string]bool{} // "<namespace>|<group>|<resource>|<verb>"
	err = filepath.WalkDir(filepath.Join(root, "registrar"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			m := marker.FindStringSubmatch(strings.TrimSpace(line))
			if m == nil {
				continue
			}
			kv := map[string]string{}
			for _, f := range strings.Split(m[1], ",") {
				k, v, _ := strings.Cut(f, "=")
				kv[k] = strings.Trim(v, `"`)
			}
			for _, g := range strings.Split(kv["groups"], ";") {
				for _, r := range strings.Split(kv["resources"], ";") {
					for _, v := range strings.Split(kv["verbs"], ";") {
						want[kv["namespace"]+"|"+g+"|"+r+"|"+v] = true
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatal("no +kubebuilder:rbac markers found under registrar/")
	}

	b, err := os.ReadFile(filepath.Join(root, "deploy/registrar/rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, doc := range strings.Split(string(b), "\n---") {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Namespace string `json:"namespace"`
			} `json:"metadata"`
			Rules []rbacv1.PolicyRule `json:"rules"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatal(err)
		}
		ns := ""
		switch head.Kind {
		case "ClusterRole":
		case "Role":
			ns = head.Metadata.Namespace
		default:
			continue
		}
		for _, r := range head.Rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						got[ns+"|"+g+"|"+res+"|"+v] = true
					}
				}
			}
		}
	}
	var missing, extra []string
	for k := range want {
		if !got[k] {
			missing = append(missing, k)
		}
	}
	for k := range got {
		if !want[k] {
			extra = append(extra, k)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("deploy/registrar/rbac.yaml disagrees with the markers (namespace|group|resource|verb):\nmissing: %v\nextra: %v", missing, extra)
	}
}
