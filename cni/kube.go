package cni

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/model"
)

// KubePods implements PodLookup and NodePods with client-go against the API server. Every call
// honours its context's deadline (the Server bounds them with ServerConfig.LookupTimeout).
type KubePods struct {
	Client kubernetes.Interface
}

// LookupPod reads the pod and its namespace (two GETs). It returns an error naming the pod when
// either read fails, including when ctx's deadline passes first.
func (k *KubePods) LookupPod(ctx context.Context, namespace, name string) (PodInfo, error) {
	pod, err := k.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return PodInfo{}, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	ns, err := k.Client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	if err != nil {
		return PodInfo{}, fmt.Errorf("get namespace %s: %w", namespace, err)
	}
	return podInfo(pod, ns)
}

func podInfo(pod *corev1.Pod, ns *corev1.Namespace) (PodInfo, error) {
	info := PodInfo{UID: string(pod.UID), ServiceAccount: pod.Spec.ServiceAccountName}
	info.InMesh, info.NotMeshedReason = model.PodMeshed(pod, model.NamespaceMeshed(ns.Labels))
	proto := model.ProtocolHTTP
	if v, ok := pod.Annotations[model.AnnotationPortProtocol]; ok {
		p, err := model.ParseProtocol(v)
		if err != nil {
			return PodInfo{}, fmt.Errorf("pod %s/%s: annotation %s: %w", pod.Namespace, pod.Name, model.AnnotationPortProtocol, err)
		}
		proto = p
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			pp := model.PodPort{Name: p.Name, Port: uint32(p.ContainerPort), Protocol: proto}
			if p.Protocol == corev1.ProtocolUDP {
				pp.Protocol = model.ProtocolUDP
			}
			info.Ports = append(info.Ports, pp)
		}
	}
	info.ProbePorts = ProbePorts(pod)
	return info, nil
}

// ProbePorts returns the TCP ports the kubelet probes pod on, sorted and without duplicates: the
// httpGet, tcpSocket and grpc port of every liveness, readiness and startup probe of its
// containers and of its restartable init containers (sidecars, KEP-753), a named port resolved
// against its own container's ports as the kubelet does (a name the container does not declare
// is left out: the kubelet's probe fails on it too). Strict inbound capture opens these ports,
// and only these, to the node's addresses (capture.Config.ProbePorts).
func ProbePorts(pod *corev1.Pod) []uint16 {
	var out []uint16
	add := func(c *corev1.Container, port intstr.IntOrString) {
		if port.Type == intstr.String {
			for _, p := range c.Ports {
				if p.Name == port.StrVal && p.Protocol != corev1.ProtocolUDP && p.Protocol != corev1.ProtocolSCTP {
					out = append(out, uint16(p.ContainerPort))
				}
			}
			return
		}
		if port.IntVal > 0 && port.IntVal < 1<<16 {
			out = append(out, uint16(port.IntVal))
		}
	}
	containers := slices.Clone(pod.Spec.Containers)
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			containers = append(containers, c)
		}
	}
	for i := range containers {
		c := &containers[i]
		for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
			switch {
			case pr == nil:
			case pr.HTTPGet != nil:
				add(c, pr.HTTPGet.Port)
			case pr.TCPSocket != nil:
				add(c, pr.TCPSocket.Port)
			case pr.GRPC != nil:
				add(c, intstr.FromInt32(pr.GRPC.Port))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// MeshedPodsOnNode lists the pods bound to node (field selector spec.nodeName) that are running
// or pending with an IP, not host-network, in an opted-in namespace and not opted out.
func (k *KubePods) MeshedPodsOnNode(ctx context.Context, node string) ([]PodRef, error) {
	pods, err := k.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, fmt.Errorf("list pods on node %s: %w", node, err)
	}
	nsCache := map[string]*corev1.Namespace{}
	var out []PodRef
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Status.PodIP == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ns, ok := nsCache[p.Namespace]
		if !ok {
			ns, err = k.Client.CoreV1().Namespaces().Get(ctx, p.Namespace, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("get namespace %s: %w", p.Namespace, err)
			}
			nsCache[p.Namespace] = ns
		}
		info, err := podInfo(p, ns)
		if err != nil {
			continue
		}
		if ok, _ := info.Meshed(); ok {
			out = append(out, PodRef{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)})
		}
	}
	return out, nil
}

// DeletePod removes the pod with a DELETE preconditioned on its UID (so a replacement pod of the
// same name is never removed), with the pod's own grace period; its controller recreates it
// through the CNI chain. It deletes rather than using the policy/v1 Eviction subresource because
// only a delete can be limited to the agent's own node: the admission policy
// deploy/agent/policy.yaml compares the deleted pod's spec.nodeName with the node-name claim of
// the agent's token, and an Eviction request shows admission neither the pod nor its node. So
// PodDisruptionBudgets are not consulted (a budget would otherwise keep an uncaptured pod
// running). A pod already gone is not an error; any other refusal (such as the policy's) is
// returned wrapped, naming the pod.
func (k *KubePods) DeletePod(ctx context.Context, pod PodRef) error {
	opts := metav1.DeleteOptions{}
	if pod.UID != "" {
		uid := k8stypes.UID(pod.UID)
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	if err := k.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opts); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}
