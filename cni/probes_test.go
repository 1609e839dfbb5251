package cni

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestProbePorts: every probe kind of every container and of sidecar init containers, named
// ports resolved against the probe's own container, and what the kubelet could not probe left out.
func TestProbePorts(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	httpProbe := func(p intstr.IntOrString) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: p}}}
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{
			{Name: "sidecar", RestartPolicy: &always, Ports: []corev1.ContainerPort{{Name: "admin", ContainerPort: 9901}},
				ReadinessProbe: httpProbe(intstr.FromString("admin"))},
			// A run-to-completion init container's probes are never run (the API refuses them,
			// and the kubelet would not probe it).
			{Name: "init", LivenessProbe: httpProbe(intstr.FromInt32(7000))},
		},
		Containers: []corev1.Container{
			{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				LivenessProbe:  httpProbe(intstr.FromString("http")),
				ReadinessProbe: httpProbe(intstr.FromInt32(8080)),
				StartupProbe:   &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8443)}}}},
			{Name: "grpc", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}, {Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP}},
				LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 50051}}},
				// "http" is the app container's port name, not this one's; "dns" is UDP.
				ReadinessProbe: httpProbe(intstr.FromString("http")),
				StartupProbe:   httpProbe(intstr.FromString("dns"))},
			{Name: "exec", LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}},
		},
	}}
	if got, want := ProbePorts(pod), []uint16{8080, 8443, 9901, 50051}; !slices.Equal(got, want) {
		t.Fatalf("ProbePorts = %v, want %v", got, want)
	}
	if got := ProbePorts(&corev1.Pod{}); len(got) != 0 {
		t.Fatalf("ProbePorts of a pod without probes = %v, want none", got)
	}
}
