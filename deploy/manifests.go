package deploy

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// FS holds every manifest under deploy/, with paths relative to deploy/ (for example
// "agent/daemonset.yaml"): the Helm chart rendered with its defaults (hack/update-manifests.sh).
//
//go:embed *.yaml agent/*.yaml registrar/*.yaml spire/*.yaml crds/*.yaml uninstall/*.yaml
var FS embed.FS

// ChartDir is the Helm chart's directory, relative to deploy/.
const ChartDir = "chart/aether"

// Config is the path (in FS) of the aether-config ConfigMap, which is applied before the
// kustomization and is deliberately not part of it.
const Config = "config.yaml"

// Files returns every manifest path in FS, sorted.
func Files() ([]string, error) {
	var out []string
	err := fs.WalkDir(FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") {
			out = append(out, p)
		}
		return err
	})
	sort.Strings(out)
	return out, err
}

// Kustomization returns the resources of kustomization.yaml in order. It returns an error when
// the file uses anything but a plain resources list, since the tests apply exactly these files.
func Kustomization() ([]string, error) {
	b, err := FS.ReadFile("kustomization.yaml")
	if err != nil {
		return nil, fmt.Errorf("read kustomization: %w", err)
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		return nil, fmt.Errorf("read kustomization: %w", err)
	}
	if k.Kind != "Kustomization" || len(k.Resources) == 0 {
		return nil, fmt.Errorf("read kustomization: kind %q with %d resources", k.Kind, len(k.Resources))
	}
	return k.Resources, nil
}

// Objects decodes every YAML document of the manifest at path (in FS), skipping empty ones.
func Objects(path string) ([]*unstructured.Unstructured, error) {
	b, err := FS.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return DecodeObjects(path, b)
}

// DecodeObjects decodes every YAML (or JSON) document of b, skipping empty ones, such as the
// output of helm template; name is what errors call the input.
func DecodeObjects(name string, b []byte) ([]*unstructured.Unstructured, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := d.Decode(&m); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode %s: %w", name, err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// Decode strictly decodes the single object of kind at path into out (for example an
// *appsv1.DaemonSet): an unknown field is an error naming it.
func Decode(path, kind string, out any) error {
	objs, err := Objects(path)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if o.GetKind() != kind {
			continue
		}
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			return fmt.Errorf("decode %s %s: %w", path, kind, err)
		}
		if err := yaml.UnmarshalStrict(b, out); err != nil {
			return fmt.Errorf("decode %s %s: %w", path, kind, err)
		}
		return nil
	}
	return fmt.Errorf("decode %s: no %s", path, kind)
}

// ConfigData returns the data of the aether-config ConfigMap in config.yaml.
func ConfigData() (map[string]string, error) {
	var cm corev1.ConfigMap
	if err := Decode(Config, "ConfigMap", &cm); err != nil {
		return nil, err
	}
	return cm.Data, nil
}

// Env computes a container's environment as the kubelet does: envFrom sources first (in order),
// then env entries, which win. configMaps maps a ConfigMap name to its data; fieldRefs maps a
// downward API fieldPath (for example "spec.nodeName") to the value the test stands in for.
// A reference to a missing ConfigMap that is not optional, or to an unknown fieldPath, is an
// error; secret references are not supported (the manifests use files for secrets).
func Env(c corev1.Container, configMaps map[string]map[string]string, fieldRefs map[string]string) (map[string]string, error) {
	env := map[string]string{}
	for _, f := range c.EnvFrom {
		if f.ConfigMapRef == nil {
			return nil, fmt.Errorf("container %s: envFrom: only configMapRef is supported", c.Name)
		}
		data, ok := configMaps[f.ConfigMapRef.Name]
		if !ok && (f.ConfigMapRef.Optional == nil || !*f.ConfigMapRef.Optional) {
			return nil, fmt.Errorf("container %s: envFrom: ConfigMap %q not given", c.Name, f.ConfigMapRef.Name)
		}
		for k, v := range data {
			env[f.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expand(e.Value, env)
		case e.ValueFrom.FieldRef != nil:
			v, ok := fieldRefs[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				return nil, fmt.Errorf("container %s: env %s: no value for fieldPath %q", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = v
		case e.ValueFrom.ConfigMapKeyRef != nil:
			r := e.ValueFrom.ConfigMapKeyRef
			v, ok := configMaps[r.Name][r.Key]
			if !ok && (r.Optional == nil || !*r.Optional) {
				return nil, fmt.Errorf("container %s: env %s: ConfigMap %q key %q not given", c.Name, e.Name, r.Name, r.Key)
			}
			env[e.Name] = v
		default:
			return nil, fmt.Errorf("container %s: env %s: unsupported valueFrom", c.Name, e.Name)
		}
	}
	return env, nil
}

// Args returns the container's args with $(VAR) references expanded from env, as the kubelet
// expands them ($$ escapes a dollar; an unknown reference stays as written).
func Args(c corev1.Container, env map[string]string) []string {
	out := make([]string, len(c.Args))
	for i, a := range c.Args {
		out[i] = expand(a, env)
	}
	return out
}

var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// Container returns the container (or init container) named name of spec.
func Container(spec corev1.PodSpec, name string) (corev1.Container, error) {
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		if c.Name == name {
			return c, nil
		}
	}
	return corev1.Container{}, fmt.Errorf("no container %q", name)
}

// MountedFrom returns the volume mounted over path in container c of spec (the mount with the
// longest mountPath that is path or a parent of it), with the path relative to the mount.
func MountedFrom(spec corev1.PodSpec, c corev1.Container, path string) (corev1.Volume, corev1.VolumeMount, string, error) {
	var best *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		mp := strings.TrimSuffix(m.MountPath, "/")
		if (path == mp || strings.HasPrefix(path, mp+"/")) && (best == nil || len(mp) > len(best.MountPath)) {
			best = &c.VolumeMounts[i]
		}
	}
	if best == nil {
		return corev1.Volume{}, corev1.VolumeMount{}, "", fmt.Errorf("container %s: %s is on no volume", c.Name, path)
	}
	for _, v := range spec.Volumes {
		if v.Name == best.Name {
			return v, *best, strings.TrimPrefix(strings.TrimPrefix(path, strings.TrimSuffix(best.MountPath, "/")), "/"), nil
		}
	}
	return corev1.Volume{}, corev1.VolumeMount{}, "", fmt.Errorf("container %s: mount %s names no volume", c.Name, best.Name)
}

// MissingFiles splits a configuration error (a single error or an errors.Join of them) into the
// paths of files that do not exist (fs.ErrNotExist from os.Stat) and the rest, joined (nil when
// every error is a missing file). Tests use it to accept exactly the errors that come from
// files a volume supplies in the cluster but not on the test machine.
func MissingFiles(err error) ([]string, error) {
	if err == nil {
		return nil, nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var missing []string
	var other []error
	for _, e := range errs {
		var pe *fs.PathError
		if errors.Is(e, fs.ErrNotExist) && errors.As(e, &pe) {
			missing = append(missing, pe.Path)
			continue
		}
		other = append(other, e)
	}
	return missing, errors.Join(other...)
}
