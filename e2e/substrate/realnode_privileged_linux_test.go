//go:build linux

package substrate

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aethermesh/aether/images"
	"github.com/aethermesh/aether/internal/testenv"
)

// realPod points a workload pod built for the stand-in (Command = a binary on this machine) at
// the workloads' image on a real node (the binaries are on its PATH).
func realPod(p *corev1.Pod, name string) *corev1.Pod {
	c := &p.Spec.Containers[0]
	c.Image, c.Command, c.ImagePullPolicy = images.WorkloadsImage, []string{name}, corev1.PullIfNotPresent
	return p
}

// TestPrivilegedRealNodes: one cluster of two real nodes (containerd, runc, kubelet, kube-proxy;
// kube-controller-manager, kube-scheduler, CoreDNS): images pulled from the substrate's registry,
// a Secret volume read through pods/exec, pod logs, exec and port-forward through the real
// kubectl, the pod's hostname, HTTP across nodes to the pod IP, to the Service's ClusterIP (kube-proxy) and to its
// DNS name (CoreDNS), a Deployment's pods scheduled by kube-scheduler; after Stop, no cgroup,
// mount or process of the run is left.
func TestPrivilegedRealNodes(t *testing.T) {
	testenv.RequireRoot(t)
	tl := testenv.RequireTools(t, testenv.ToolEtcd, testenv.ToolKubeAPIServer, testenv.ToolCNIPlugins, testenv.ToolNodes)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{
		RealNodes: true,
		Clusters:  []ClusterSpec{{Name: "alpha", PodCIDR: "10.244.0.0/16", Nodes: 2}},
		Logger:    slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			s.Stop()
		}
	})
	t.Logf("real nodes up in %s", s.StartupTime)
	if err := s.PushWorkloadImages(ctx); err != nil {
		t.Fatal(err)
	}
	c := s.Clusters[0]
	const ns = "rn"
	if err := c.CreateNamespace(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	const secretValue = "s3cr3t-from-a-volume"
	if _, err := c.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"}, StringData: map[string]string{"token": secretValue},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	echo := realPod(EchoPod(ns, "echo", "alpha-node1", c.Name, ""), "echo")
	client := realPod(ClientPod(ns, "client", "alpha-node2", c.Name, ""), "client")
	client.Spec.Volumes = []corev1.Volume{{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}}}
	client.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "creds", MountPath: "/etc/creds", ReadOnly: true}}
	for _, p := range []*corev1.Pod{echo, client} {
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Client.CoreV1().Services(ns).Create(ctx, EchoService(ns, "echo", "echo"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ep, err := c.WaitPodReady(ctx, ns, "echo")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitPodReady(ctx, ns, "client"); err != nil {
		t.Fatal(err)
	}

	// pods/exec through the API server, the kubelet and containerd; a Secret volume.
	got, err := c.ExecInPod(ctx, ns, "client", "client", "read", "/etc/creds/token")
	if err != nil || string(got) != secretValue {
		t.Fatalf("read the Secret volume through exec: %q, %v; want %q", got, err, secretValue)
	}
	// The real kubectl: exec (the pod's hostname is its name) and logs.
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, filepath.Join(tl.KubernetesDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig, "-n", ns}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	if got := kubectl("exec", "client", "--", "client", "read", "/etc/hostname"); strings.TrimSpace(got) != "client" {
		t.Errorf("kubectl exec: /etc/hostname = %q, want client", got)
	}
	if got := kubectl("logs", "echo"); !strings.Contains(got, "serving HTTP") {
		t.Errorf("kubectl logs echo = %q, want the echo's start-up lines", got)
	}
	// kubectl port-forward (pods/portforward through the API server and the kubelet): a local
	// port on this machine reaches the echo pod's HTTP port.
	pf := exec.CommandContext(ctx, filepath.Join(tl.KubernetesDir, "kubectl"), "--kubeconfig", c.Kubeconfig, "-n", ns,
		"port-forward", "pod/echo", fmt.Sprintf(":%d", EchoHTTPPort))
	pfOut, err := pf.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pf.Process.Kill(); _ = pf.Wait() })
	line, err := bufio.NewReader(pfOut).ReadString('\n')
	var local string
	if _, serr := fmt.Sscanf(line, "Forwarding from %s -> ", &local); err != nil || serr != nil {
		t.Fatalf("kubectl port-forward printed %q (%v, %v)", line, err, serr)
	}
	resp, err := http.Get("http://" + local + "/")
	if err != nil {
		t.Fatalf("GET through kubectl port-forward %s: %v", local, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"server":"echo"`) {
		t.Errorf("through kubectl port-forward: %s", body)
	}

	// Traffic between the nodes: pod IP (Flannel's vxlan), ClusterIP (kube-proxy), DNS name
	// (CoreDNS).
	svc, err := c.Client.CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{
		fmt.Sprintf("http://%s:%d/", ep.Status.PodIP, EchoHTTPPort),
		fmt.Sprintf("http://%s/", svc.Spec.ClusterIP),
		"http://echo." + ns + ".svc.cluster.local/",
	} {
		testenv.Eventually(t, 30*time.Second, "GET "+url+" from the other node", func() error {
			out, err := c.ExecInPod(ctx, ns, "client", "client", "http", url)
			if err != nil {
				return err
			}
			if !strings.Contains(string(out), `"server":"echo"`) {
				return fmt.Errorf("answer %s is not the echo pod's", out)
			}
			return nil
		})
	}

	// A Deployment: kube-controller-manager makes its ReplicaSet and pods, kube-scheduler
	// places them.
	dep := realPod(ClientPod(ns, "x", "", c.Name, ""), "client")
	if err := createDeployment(ctx, c, ns, "sleepers", 2, dep.Spec); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "the Deployment's pods running", func() error {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=sleepers"})
		if err != nil {
			return err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if running != 2 {
			return fmt.Errorf("%d of 2 Deployment pods running", running)
		}
		return nil
	})

	cgroupName := filepath.Base(s.Dir)
	dir := s.Dir
	s.Stop()
	stopped = true
	for _, ctrl := range []string{"cpu", "memory", "pids", "cpuset", "systemd", "unified"} {
		if _, err := os.Stat(filepath.Join(cgroupBase, ctrl, cgroupName)); !os.IsNotExist(err) {
			t.Errorf("cgroup %s/%s left after Stop (%v)", ctrl, cgroupName, err)
		}
	}
	if pids, _ := runProcesses(dir); len(pids) > 0 {
		t.Errorf("processes left after Stop: %v", pids)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), dir) {
		t.Errorf("mounts under %s left after Stop", dir)
	}
}

// createDeployment creates a Deployment of replicas pods with spec, labelled app=<name>.
func createDeployment(ctx context.Context, c *Cluster, ns, name string, replicas int32, spec corev1.PodSpec) error {
	labels := map[string]string{"app": name}
	spec.NodeName = ""
	_, err := c.Client.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}, metav1.CreateOptions{})
	return err
}
