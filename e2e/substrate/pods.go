package substrate

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Ports of the workload pods built by EchoPod and ServerFirstPod.
const (
	EchoHTTPPort       = 8080
	EchoGRPCPort       = 9090
	EchoTCPPort        = 9000
	EchoUDPPort        = 9053
	ServerFirstTCPPort = 2525
)

// workloadEnv is the downward-API environment every workload reads its identity from.
func workloadEnv(cluster string) []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
		{Name: "CLUSTER", Value: cluster},
	}
}

func workloadPod(ns, name, node string, labels map[string]string, c corev1.Container) *corev1.Pod {
	grace := int64(2)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			Containers:                    []corev1.Container{c},
			TerminationGracePeriodSeconds: &grace,
		},
	}
}

// EchoPod is a pod running the echo workload (binary echoBin) on node, labelled app=<name>,
// serving HTTP on 8080, gRPC on 9090, TCP on 9000 and UDP on 9053, Ready when GET /healthz answers (probed every second).
func EchoPod(ns, name, node, cluster, echoBin string) *corev1.Pod {
	return workloadPod(ns, name, node, map[string]string{"app": name}, corev1.Container{
		Name: "echo", Image: "aether.local/echo", Command: []string{echoBin},
		Env: workloadEnv(cluster),
		Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: EchoHTTPPort, Protocol: corev1.ProtocolTCP},
			{Name: "grpc", ContainerPort: EchoGRPCPort, Protocol: corev1.ProtocolTCP},
			{Name: "tcp", ContainerPort: EchoTCPPort, Protocol: corev1.ProtocolTCP},
			{Name: "udp", ContainerPort: EchoUDPPort, Protocol: corev1.ProtocolUDP},
		},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
			PeriodSeconds: 1,
		},
	})
}

// ServerFirstPod is a pod running the server-first workload on node (port 2525), labelled
// app=<name>, Ready when its port accepts (probed every second).
func ServerFirstPod(ns, name, node, cluster, bin string) *corev1.Pod {
	return workloadPod(ns, name, node, map[string]string{"app": name}, corev1.Container{
		Name: "server", Image: "aether.local/serverfirst", Command: []string{bin},
		Env:   workloadEnv(cluster),
		Ports: []corev1.ContainerPort{{Name: "smtp", ContainerPort: ServerFirstTCPPort, Protocol: corev1.ProtocolTCP}},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(ServerFirstTCPPort)}},
			PeriodSeconds: 1,
		},
	})
}

// ClientPod is a pod idling with the client workload ("client sleep") on node; tests run the
// client's one-shot modes in it with Cluster.ExecInPod.
func ClientPod(ns, name, node, cluster, clientBin string) *corev1.Pod {
	return workloadPod(ns, name, node, map[string]string{"app": name}, corev1.Container{
		Name: "client", Image: "aether.local/client", Command: []string{clientBin}, Args: []string{"sleep"},
		Env: workloadEnv(cluster),
	})
}

// EchoService is a ClusterIP Service selecting app=<app> with the echo ports (http 80, grpc
// 9090 with appProtocol kubernetes.io/h2c, tcp 9000).
func EchoService(ns, name, app string) *corev1.Service {
	h2c := "kubernetes.io/h2c"
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": app},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromInt32(EchoHTTPPort), Protocol: corev1.ProtocolTCP},
				{Name: "grpc", Port: EchoGRPCPort, TargetPort: intstr.FromInt32(EchoGRPCPort), Protocol: corev1.ProtocolTCP, AppProtocol: &h2c},
				{Name: "tcp", Port: EchoTCPPort, TargetPort: intstr.FromInt32(EchoTCPPort), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

// pickNode is the scheduler stand-in's choice for an unscheduled pod: among the Ready nodes
// whose labels match spec.nodeSelector, the one running the fewest pods (non-terminated pods
// bound to it), ties broken by name. ok is false when no node fits. Affinity, taints and
// resources are not considered.
func pickNode(pod *corev1.Pod, nodes []*corev1.Node, pods []*corev1.Pod) (name string, ok bool) {
	load := map[string]int{}
	for _, p := range pods {
		if p.Spec.NodeName != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			load[p.Spec.NodeName]++
		}
	}
	var fit []*corev1.Node
	for _, n := range nodes {
		ready := false
		for _, c := range n.Status.Conditions {
			ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
		}
		match := true
		for k, v := range pod.Spec.NodeSelector {
			match = match && n.Labels[k] == v
		}
		if ready && match {
			fit = append(fit, n)
		}
	}
	if len(fit) == 0 {
		return "", false
	}
	slices.SortFunc(fit, func(a, b *corev1.Node) int {
		if d := load[a.Name] - load[b.Name]; d != 0 {
			return d
		}
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return fit[0].Name, true
}
