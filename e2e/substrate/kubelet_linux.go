//go:build linux

package substrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
)

// PodSandbox is what the kubelet stand-in made for a running pod: its network namespace, the
// result of the node's CNI chain and the pod's files.
type PodSandbox struct {
	Namespace, Name string
	UID             types.UID
	// ContainerID is the CNI container ID (the pod UID).
	ContainerID string
	// Netns is the pod's network namespace; nil for hostNetwork pods (they use the node's).
	Netns *testenv.Netns
	// IP is the pod IP from the chain's result (the node IP for hostNetwork pods).
	IP netip.Addr
	// CNIResult is the chain's final result (CNI spec 1.1 result of the last plugin).
	CNIResult *current.Result
	// Dir holds the pod's resolv.conf, hosts file and container logs (<container>.log).
	Dir string

	rt         *libcni.RuntimeConf
	containers []*container
	cancel     context.CancelFunc
	done       chan struct{}
}

type container struct {
	spec     corev1.Container
	mu       sync.Mutex
	proc     *Process
	started  time.Time
	restarts int32
	ready    bool
	exit     *int // set when the container stays terminated (restartPolicy)
	lastProb time.Time
}

// kubelet is the stand-in for one node: it watches the Pods bound to the node and runs them.
type kubelet struct {
	node  *Node
	cs    kubernetes.Interface
	log   *slog.Logger
	cni   *libcni.CNIConfig
	queue workqueue.TypedRateLimitingInterface[string]
	lst   cache.Indexer

	mu   sync.Mutex
	pods map[string]*PodSandbox // by namespace/name
}

func newKubelet(n *Node, cs kubernetes.Interface, log *slog.Logger) *kubelet {
	return &kubelet{
		node: n, cs: cs, log: log.With("node", n.Name),
		cni:   libcni.NewCNIConfigWithCacheDir([]string{n.hostPath("/opt/cni/bin")}, n.hostPath("/var/lib/cni"), &nodeExec{netnsPath: n.Netns.Path, binds: n.Binds()}),
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 5*time.Second)),
		pods:  map[string]*PodSandbox{},
	}
}

// run watches the node's pods until ctx ends, then tears every pod down (CNI DEL included).
func (k *kubelet) run(ctx context.Context) {
	f := informers.NewSharedInformerFactoryWithOptions(k.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.node.Name).String()
	}))
	inf := f.Core().V1().Pods().Informer()
	k.lst = inf.GetIndexer()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, DeleteFunc: enqueue,
		UpdateFunc: func(_, o any) { enqueue(o) },
	})
	f.Start(ctx.Done())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for k.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	k.queue.ShutDown()
	wg.Wait()
	f.Shutdown()
	k.mu.Lock()
	all := slices.Collect(maps.Values(k.pods))
	k.pods = map[string]*PodSandbox{}
	k.mu.Unlock()
	var twg sync.WaitGroup
	for _, p := range all {
		twg.Go(func() { k.teardown(p, 2*time.Second) })
	}
	twg.Wait()
}

func (k *kubelet) processNext(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil {
		if ctx.Err() == nil {
			k.log.Warn("sync pod", "pod", key, "err", err)
			k.queue.AddRateLimited(key)
		}
		return true
	}
	k.queue.Forget(key)
	return true
}

// sync makes the node match one pod: start it when it is new, tear it down when it is being
// deleted (then remove the object, as the kubelet's final grace-0 delete does) or gone.
func (k *kubelet) sync(ctx context.Context, key string) error {
	obj, exists, err := k.lst.GetByKey(key)
	if err != nil {
		return err
	}
	k.mu.Lock()
	sb := k.pods[key]
	k.mu.Unlock()
	var pod *corev1.Pod
	if exists {
		pod = obj.(*corev1.Pod)
	}
	if sb != nil && (pod == nil || pod.UID != sb.UID || pod.DeletionTimestamp != nil) {
		grace := 2 * time.Second
		if pod != nil && pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
		k.teardown(sb, grace)
		k.mu.Lock()
		delete(k.pods, key)
		k.mu.Unlock()
		sb = nil
	}
	if pod == nil {
		return nil
	}
	if pod.DeletionTimestamp != nil {
		zero := int64(0)
		err := k.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete pod %s: %w", key, err)
		}
		return nil
	}
	if sb != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	sb, err = k.start(ctx, pod)
	if err != nil {
		_ = k.writeStatus(ctx, pod, func(s *corev1.PodStatus) {
			s.Phase = corev1.PodPending
			s.Reason, s.Message = "SandboxFailed", err.Error()
		})
		return err
	}
	k.mu.Lock()
	k.pods[key] = sb
	k.mu.Unlock()
	return nil
}

// sandbox returns the running pod's sandbox.
func (k *kubelet) sandbox(ns, name string) (*PodSandbox, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	sb, ok := k.pods[ns+"/"+name]
	return sb, ok
}

// start creates the pod's network namespace, runs CNI ADD with the node's conflist, writes its
// resolv.conf and hosts file, starts its containers and its supervisor. On error it undoes what
// it did.
func (k *kubelet) start(ctx context.Context, pod *corev1.Pod) (_ *PodSandbox, err error) {
	n := k.node
	sb := &PodSandbox{
		Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, ContainerID: string(pod.UID),
		Dir: filepath.Join(n.Cluster.s.Dir, "pods", n.Cluster.Name, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)[:8]),
	}
	for _, c := range pod.Spec.Containers {
		if len(c.Command) == 0 {
			return nil, fmt.Errorf("start pod %s/%s: container %q: the substrate runs no images; set command to a binary on this machine", pod.Namespace, pod.Name, c.Name)
		}
	}
	if err := os.MkdirAll(sb.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("start pod: %w", err)
	}
	defer func() {
		if err != nil {
			k.teardown(sb, 0)
		}
	}()
	if pod.Spec.HostNetwork {
		sb.IP = n.Plan.IP
	} else {
		sb.Netns, err = createNetns(n.Cluster.s.netnsDir, "pod-"+string(pod.UID))
		if err != nil {
			return sb, err
		}
		confList, err := libcni.NetworkConfFromFile(n.hostPath("/etc/cni/net.d/" + ConflistFile))
		if err != nil {
			return sb, fmt.Errorf("load conflist of %s: %w", n.Name, err)
		}
		sb.rt = &libcni.RuntimeConf{
			ContainerID: sb.ContainerID, NetNS: sb.Netns.Path, IfName: "eth0",
			Args: [][2]string{
				{"IgnoreUnknown", "1"},
				{"K8S_POD_NAMESPACE", pod.Namespace},
				{"K8S_POD_NAME", pod.Name},
				{"K8S_POD_INFRA_CONTAINER_ID", sb.ContainerID},
				{"K8S_POD_UID", string(pod.UID)},
			},
		}
		actx, cancel := context.WithTimeout(ctx, 60*time.Second)
		res, err := k.cni.AddNetworkList(actx, confList, sb.rt)
		cancel()
		if err != nil {
			return sb, fmt.Errorf("CNI ADD for %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		cur, err := current.NewResultFromResult(res)
		if err != nil {
			return sb, fmt.Errorf("CNI ADD for %s/%s: convert result: %w", pod.Namespace, pod.Name, err)
		}
		sb.CNIResult = cur
		if len(cur.IPs) == 0 {
			return sb, fmt.Errorf("CNI ADD for %s/%s: result has no IP", pod.Namespace, pod.Name)
		}
		sb.IP, _ = netip.AddrFromSlice(cur.IPs[0].Address.IP.To4())
	}
	resolv, err := PodResolvConf(pod, n.Cluster.Plan.DNSIP, n.Cluster.s.Plan.ClusterDomain, NodeResolvConf(n.Cluster.Plan.DNSIP))
	if err != nil {
		return sb, err
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost\n%s\t%s\n", sb.IP, pod.Name)
	if err := os.WriteFile(filepath.Join(sb.Dir, "resolv.conf"), resolv, 0o644); err != nil {
		return sb, err
	}
	if err := os.WriteFile(filepath.Join(sb.Dir, "hosts"), []byte(hosts), 0o644); err != nil {
		return sb, err
	}
	for _, c := range pod.Spec.Containers {
		ctr := &container{spec: c}
		sb.containers = append(sb.containers, ctr)
		if err := k.startContainer(pod, sb, ctr); err != nil {
			return sb, err
		}
	}
	sctx, cancel := context.WithCancel(context.Background())
	sb.cancel, sb.done = cancel, make(chan struct{})
	go k.supervise(sctx, pod, sb)
	return sb, nil
}

func (k *kubelet) procName(sb *PodSandbox, c string) string {
	return fmt.Sprintf("pod/%s/%s/%s/%s", k.node.Cluster.Name, sb.Namespace, sb.Name, c)
}

// startContainer runs one container's command in the pod's namespaces: network (the pod netns,
// or the node's for hostNetwork), a fresh mount namespace with resolv.conf and hosts bound (and
// the node's files for hostNetwork pods), and a UTS namespace named after the pod.
func (k *kubelet) startContainer(pod *corev1.Pod, sb *PodSandbox, c *container) error {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "HOSTNAME=" + pod.Name,
	}
	for _, e := range c.spec.Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				return fmt.Errorf("start container %s of %s/%s: env %s: only value and fieldRef are supported", c.spec.Name, pod.Namespace, pod.Name, e.Name)
			}
			var err error
			if v, err = fieldRef(pod, sb, k.node, e.ValueFrom.FieldRef.FieldPath); err != nil {
				return fmt.Errorf("start container %s of %s/%s: env %s: %w", c.spec.Name, pod.Namespace, pod.Name, e.Name, err)
			}
		}
		env = append(env, e.Name+"="+v)
	}
	binds := [][2]string{{filepath.Join(sb.Dir, "resolv.conf"), "/etc/resolv.conf"}, {filepath.Join(sb.Dir, "hosts"), "/etc/hosts"}}
	netnsPath := k.node.Netns.Path
	if sb.Netns != nil {
		netnsPath = sb.Netns.Path
	} else {
		// Later binds stack over earlier ones: the pod's resolv.conf wins over the node's.
		binds = append(k.node.Binds(), binds...)
	}
	argv := append(slices.Clone(c.spec.Command), c.spec.Args...)
	if c.spec.WorkingDir != "" {
		argv = append([]string{"env", "--chdir=" + c.spec.WorkingDir}, argv...)
	}
	name := k.procName(sb, c.spec.Name)
	k.node.Cluster.s.procs.remove(name)
	p, err := k.node.Cluster.s.procs.start(name, nsWrap(netnsPath, binds, pod.Name, argv), env, filepath.Join(sb.Dir, c.spec.Name+".log"))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.proc, c.started, c.ready, c.exit = p, time.Now(), c.spec.ReadinessProbe == nil, nil
	c.mu.Unlock()
	return nil
}

// fieldRef resolves the downward API fields the substrate supports.
func fieldRef(pod *corev1.Pod, sb *PodSandbox, n *Node, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return n.Name, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return sb.IP.String(), nil
	case "status.hostIP", "status.hostIPs": // the substrate's nodes are single-stack
		return n.Plan.IP.String(), nil
	}
	if k, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
		return pod.Labels[strings.TrimSuffix(k, "']")], nil
	}
	return "", fmt.Errorf("fieldRef %q is not supported", path)
}

// supervise restarts exited containers per restartPolicy (after 1 s), runs readiness probes
// (tcpSocket, httpGet, exec) from the node's network namespace at their periodSeconds, and
// writes the pod status whenever it changes.
func (k *kubelet) supervise(ctx context.Context, pod *corev1.Pod, sb *PodSandbox) {
	defer close(sb.done)
	var last string
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, c := range sb.containers {
			k.checkContainer(ctx, pod, sb, c)
		}
		st := k.status(pod, sb)
		if key := statusKey(st); key != last {
			if err := k.writeStatus(ctx, pod, func(s *corev1.PodStatus) { *s = st }); err == nil {
				last = key
			} else if ctx.Err() == nil {
				k.log.Warn("write pod status", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (k *kubelet) checkContainer(ctx context.Context, pod *corev1.Pod, sb *PodSandbox, c *container) {
	c.mu.Lock()
	p, exit := c.proc, c.exit
	c.mu.Unlock()
	if exit != nil {
		return
	}
	select {
	case <-p.Done():
		code := 0
		var ee *exec.ExitError
		if err := p.ExitErr(); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			code = 128
		}
		policy := pod.Spec.RestartPolicy
		if policy == corev1.RestartPolicyNever || (policy == corev1.RestartPolicyOnFailure && code == 0) {
			c.mu.Lock()
			c.exit, c.ready = &code, false
			c.mu.Unlock()
			return
		}
		if time.Since(c.started) < time.Second {
			return
		}
		c.mu.Lock()
		c.restarts++
		c.mu.Unlock()
		if err := k.startContainer(pod, sb, c); err != nil {
			k.log.Warn("restart container", "pod", pod.Namespace+"/"+pod.Name, "container", c.spec.Name, "err", err)
		}
		return
	default:
	}
	pr := c.spec.ReadinessProbe
	if pr == nil {
		return
	}
	period := time.Duration(max(pr.PeriodSeconds, 1)) * time.Second
	if time.Since(c.started) < time.Duration(pr.InitialDelaySeconds)*time.Second || time.Since(c.lastProb) < period {
		return
	}
	c.lastProb = time.Now()
	ok := k.probe(ctx, pod, sb, c.spec, pr)
	c.mu.Lock()
	c.ready = ok
	c.mu.Unlock()
}

// probe runs one readiness probe; the kubelet probes from the node, so network probes are dialed
// from the node's network namespace to the pod IP.
func (k *kubelet) probe(ctx context.Context, pod *corev1.Pod, sb *PodSandbox, c corev1.Container, pr *corev1.Probe) bool {
	timeout := time.Duration(max(pr.TimeoutSeconds, 1)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	port := func(p intstr.IntOrString) string {
		if p.Type == intstr.String {
			for _, cp := range c.Ports {
				if cp.Name == p.StrVal {
					return strconv.Itoa(int(cp.ContainerPort))
				}
			}
		}
		return p.String()
	}
	switch {
	case pr.TCPSocket != nil:
		host := cmpOr(pr.TCPSocket.Host, sb.IP.String())
		conn, err := dialIn(ctx, k.node.Netns, "tcp", net.JoinHostPort(host, port(pr.TCPSocket.Port)))
		if err != nil {
			return false
		}
		conn.Close()
		return true
	case pr.HTTPGet != nil:
		host := cmpOr(pr.HTTPGet.Host, sb.IP.String())
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialIn(ctx, k.node.Netns, network, addr)
		}, DisableKeepAlives: true}}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port(pr.HTTPGet.Port))+pr.HTTPGet.Path, nil)
		if err != nil {
			return false
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode >= 200 && resp.StatusCode < 400
	case pr.Exec != nil:
		_, err := k.node.Cluster.s.execIn(ctx, sb, pr.Exec.Command)
		return err == nil
	}
	return false
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// status computes the pod status from the containers.
func (k *kubelet) status(pod *corev1.Pod, sb *PodSandbox) corev1.PodStatus {
	st := corev1.PodStatus{
		Phase:   corev1.PodRunning,
		HostIP:  k.node.Plan.IP.String(),
		HostIPs: []corev1.HostIP{{IP: k.node.Plan.IP.String()}},
		PodIP:   sb.IP.String(),
		PodIPs:  []corev1.PodIP{{IP: sb.IP.String()}},
	}
	if pod.Status.StartTime != nil {
		st.StartTime = pod.Status.StartTime
	} else {
		now := metav1.Now()
		st.StartTime = &now
	}
	allReady, allExited, anyFailed := true, true, false
	for _, c := range sb.containers {
		c.mu.Lock()
		cs := corev1.ContainerStatus{Name: c.spec.Name, Image: c.spec.Image, RestartCount: c.restarts, Ready: c.ready}
		if c.exit != nil {
			cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: int32(*c.exit), StartedAt: metav1.NewTime(c.started.Truncate(time.Second))}
			anyFailed = anyFailed || *c.exit != 0
		} else {
			allExited = false
			started := true
			cs.Started = &started
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.started.Truncate(time.Second))}
		}
		allReady = allReady && c.ready
		c.mu.Unlock()
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	if allExited {
		st.Phase = corev1.PodSucceeded
		if anyFailed {
			st.Phase = corev1.PodFailed
		}
		allReady = false
	}
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		return corev1.PodCondition{Type: t, Status: s}
	}
	st.Conditions = []corev1.PodCondition{
		cond(corev1.PodScheduled, true), cond(corev1.PodInitialized, true),
		cond(corev1.ContainersReady, allReady), cond(corev1.PodReady, allReady),
	}
	return st
}

// statusKey is what makes two statuses different for the supervisor (not timestamps).
func statusKey(s corev1.PodStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", s.Phase, s.PodIP)
	for _, c := range s.ContainerStatuses {
		fmt.Fprintf(&b, " %s:%v:%d:%v", c.Name, c.Ready, c.RestartCount, c.State.Terminated != nil)
	}
	return b.String()
}

// writeStatus updates the pod's status with mutate, retrying on conflicts, and only while the
// object is still the same pod (UID).
func (k *kubelet) writeStatus(ctx context.Context, pod *corev1.Pod, mutate func(*corev1.PodStatus)) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := k.cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return nil
		}
		now := metav1.Now()
		mutate(&cur.Status)
		for i := range cur.Status.Conditions {
			cur.Status.Conditions[i].LastTransitionTime = now
		}
		_, err = k.cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// teardown stops the pod's containers (SIGTERM, then SIGKILL after grace), runs CNI DEL with the
// node's conflist and deletes the pod's network namespace and files. It is idempotent and
// tolerates a half-started pod.
func (k *kubelet) teardown(sb *PodSandbox, grace time.Duration) {
	if sb.cancel != nil {
		sb.cancel()
		<-sb.done
	}
	var wg sync.WaitGroup
	for _, c := range sb.containers {
		c.mu.Lock()
		p := c.proc
		c.mu.Unlock()
		if p != nil {
			wg.Go(func() { p.Stop(grace) })
		}
	}
	wg.Wait()
	for _, c := range sb.containers {
		k.node.Cluster.s.procs.remove(k.procName(sb, c.spec.Name))
	}
	if sb.rt != nil {
		confList, err := libcni.NetworkConfFromFile(k.node.hostPath("/etc/cni/net.d/" + ConflistFile))
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			err = k.cni.DelNetworkList(ctx, confList, sb.rt)
			cancel()
		}
		if err != nil {
			k.log.Warn("CNI DEL", "pod", sb.Namespace+"/"+sb.Name, "err", err)
		}
	}
	if sb.Netns != nil {
		if err := deleteNetns(sb.Netns.Path); err != nil {
			k.log.Warn("delete pod netns", "pod", sb.Namespace+"/"+sb.Name, "err", err)
		}
	}
}
