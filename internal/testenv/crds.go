package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// InstallCRDs creates every CustomResourceDefinition in the *.yaml files of dir (relative paths
// are taken from the repository root, e.g. "deploy/crds") and waits up to 60 s until each is
// Established. It fails the test on any error (see CreateCRDs).
func InstallCRDs(t testing.TB, cfg *rest.Config, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := CreateCRDs(ctx, cfg, dir); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// CreateCRDs creates every CustomResourceDefinition in the *.yaml files of dir (relative paths
// are taken from the repository root) and waits, until ctx ends, for each to be Established.
// An existing CRD of the same name is an error. Errors name the file or CRD.
func CreateCRDs(ctx context.Context, cfg *rest.Config, dir string) error {
	if !filepath.IsAbs(dir) {
		root, err := RepoRoot()
		if err != nil {
			return fmt.Errorf("create CRDs: %w", err)
		}
		dir = filepath.Join(root, dir)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("create CRDs: no CRD files in %s (%v)", dir, err)
	}
	cs, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create CRDs: %w", err)
	}
	// All are created first, then waited for: the API server establishes them concurrently.
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("create CRDs: %w", err)
		}
		for _, doc := range strings.Split(string(b), "\n---") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var crd apiextv1.CustomResourceDefinition
			if err := yaml.UnmarshalStrict([]byte(doc), &crd); err != nil {
				return fmt.Errorf("create CRDs: decode %s: %w", f, err)
			}
			// A CRD already there (another directory of the same CRDs: deploy/crds holds the
			// SPIRE Controller Manager's too) is kept.
			if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("create CRD %s: %w", crd.Name, err)
			}
			names = append(names, crd.Name)
		}
	}
	for _, n := range names {
		if err := waitEstablished(ctx, cs, n); err != nil {
			return fmt.Errorf("create CRDs: %w", err)
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, cs apiextclient.Interface, name string) error {
	for {
		crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not established: %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// CRDSubset copies the named CRD files of deploy/crds (e.g.
// "gateway.networking.k8s.io_httproutes.yaml") into a temporary directory of t and returns it,
// for InstallCRDs of some CRDs only (a test of a CRD installed after start). A missing file fails
// t.
func CRDSubset(t testing.TB, names ...string) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(root, "deploy/crds", n))
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	return dir
}
