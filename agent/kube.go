package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aethermesh/aether/model"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"
	mcsinformers "sigs.k8s.io/mcs-api/pkg/client/informers/externalversions"
	mcslisters "sigs.k8s.io/mcs-api/pkg/client/listers/apis/v1beta1"

	corelisters "k8s.io/client-go/listers/core/v1"
)

// KubeSource holds informers on one cluster's API server for what an agent's model needs:
// Namespaces (which are meshed), Services, MCS ServiceImports, the Pods bound to this node and this
// Node. Informers keep their last state while the API server is unreachable and re-list when it
// returns, so a model built from a KubeSource survives an API outage unchanged.
type KubeSource struct {
	nodeName string
	cs       kubernetes.Interface

	factories  []interface{ Start(<-chan struct{}) }
	synced     []cache.InformerSynced
	namespaces corelisters.NamespaceLister
	services   corelisters.ServiceLister
	pods       corelisters.PodLister
	nodes      corelisters.NodeLister
	imports    mcslisters.ServiceImportLister
	// certs are the edge listener certificates the registrar publishes (WatchEdgeCertificates);
	// nil when not watched.
	certs corelisters.SecretLister
	// CrossNamespaceCertificates is copied into Sources.Edge (model.EdgeSources); set before Start.
	CrossNamespaceCertificates bool
	resync                     time.Duration
	onChange                   func()
	mu                         sync.Mutex
	lastWatchErr               error
}

// NewKubeSource builds the informers. onChange is called (from informer goroutines, so it must
// not block: a Coalescer's Trigger fits) on every add, update or delete. resync is the informers'
// resync period (0 disables it).
func NewKubeSource(cs kubernetes.Interface, mcs mcsclient.Interface, nodeName string, resync time.Duration, onChange func()) (*KubeSource, error) {
	if nodeName == "" {
		return nil, fmt.Errorf("kube source: node name is empty")
	}
	k := &KubeSource{nodeName: nodeName, cs: cs, resync: resync, onChange: onChange}
	all := informers.NewSharedInformerFactory(cs, resync)
	onNode := informers.NewSharedInformerFactoryWithOptions(cs, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
	}))
	thisNode := informers.NewSharedInformerFactoryWithOptions(cs, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	}))
	mf := mcsinformers.NewSharedInformerFactory(mcs, resync)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { onChange() },
		UpdateFunc: func(any, any) { onChange() },
		DeleteFunc: func(any) { onChange() },
	}
	add := func(inf cache.SharedIndexInformer) error {
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("kube source: add event handler: %w", err)
		}
		if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
			k.mu.Lock()
			k.lastWatchErr = err
			k.mu.Unlock()
		}); err != nil {
			return fmt.Errorf("kube source: set watch error handler: %w", err)
		}
		k.synced = append(k.synced, inf.HasSynced)
		return nil
	}
	ns, svc, pod, node, imp := all.Core().V1().Namespaces(), all.Core().V1().Services(),
		onNode.Core().V1().Pods(), thisNode.Core().V1().Nodes(), mf.Multicluster().V1beta1().ServiceImports()
	for _, inf := range []cache.SharedIndexInformer{ns.Informer(), svc.Informer(), pod.Informer(), node.Informer(), imp.Informer()} {
		if err := add(inf); err != nil {
			return nil, err
		}
	}
	k.namespaces, k.services, k.pods, k.nodes, k.imports = ns.Lister(), svc.Lister(), pod.Lister(), node.Lister(), imp.Lister()
	k.factories = []interface{ Start(<-chan struct{}) }{all, onNode, thisNode, mf}
	return k, nil
}

// WatchEdgeCertificates adds, before Start, an informer on the Secrets of namespace (aether's)
// labelled model.LabelEdgeCertificate "true": the edge Gateways' listener certificates, which the
// registrar copies there so that agents need not read Secrets anywhere else (docs/gateway.md).
func (k *KubeSource) WatchEdgeCertificates(namespace string) error {
	f := informers.NewSharedInformerFactoryWithOptions(k.cs, k.resync, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = model.LabelEdgeCertificate + "=true"
		}))
	inf := f.Core().V1().Secrets()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.onChange() },
		UpdateFunc: func(any, any) { k.onChange() },
		DeleteFunc: func(any) { k.onChange() },
	}
	if _, err := inf.Informer().AddEventHandler(h); err != nil {
		return fmt.Errorf("kube source: add event handler: %w", err)
	}
	k.synced = append(k.synced, inf.Informer().HasSynced)
	k.certs = inf.Lister()
	k.factories = append(k.factories, f)
	return nil
}

// Start starts the informers, which run until ctx is done, and waits up to syncTimeout until they
// have synced; it returns an error when they have not by then.
func (k *KubeSource) Start(ctx context.Context, syncTimeout time.Duration) error {
	for _, f := range k.factories {
		f.Start(ctx.Done())
	}
	wctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(wctx.Done(), k.synced...) {
		return fmt.Errorf("kube source: informers not synced within %s: %w", syncTimeout, context.Cause(wctx))
	}
	return nil
}

// Healthy probes the API server's /readyz with the given timeout. It returns nil when the API
// server answers, else an error with the reason (the last watch error when there is one).
func (k *KubeSource) Healthy(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := k.cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err == nil {
		return nil
	}
	k.mu.Lock()
	last := k.lastWatchErr
	k.mu.Unlock()
	if last != nil {
		return fmt.Errorf("kubernetes API unreachable: %w (last watch error: %v)", err, last)
	}
	return fmt.Errorf("kubernetes API unreachable: %w", err)
}

// Fill copies the informers' current state into s: meshed namespaces, their Services and
// ServiceImports, this node's Pods, and this Node's InternalIP, pod CIDRs and region/zone labels (s.Node.Name
// is always the configured node name). Listers return shared objects: callers must not change them.
func (k *KubeSource) Fill(s *model.Sources) error {
	nss, err := k.namespaces.List(labels.SelectorFromSet(labels.Set{model.LabelMeshNamespace: model.MeshNamespaceEnabled}))
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	s.MeshNamespaces = map[string]bool{}
	for _, n := range nss {
		s.MeshNamespaces[n.Name] = true
	}
	all, err := k.namespaces.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	s.Edge.NamespaceLabels = make(map[string]map[string]string, len(all))
	for _, n := range all {
		s.Edge.NamespaceLabels[n.Name] = n.Labels
	}
	s.Edge.Certificates = nil
	s.Edge.CrossNamespaceCertificates = k.CrossNamespaceCertificates
	if k.certs != nil {
		if s.Edge.Certificates, err = k.certs.List(labels.Everything()); err != nil {
			return fmt.Errorf("list edge certificates: %w", err)
		}
		slices.SortFunc(s.Edge.Certificates, func(a, b *corev1.Secret) int { return strings.Compare(a.Name, b.Name) })
	}
	svcs, err := k.services.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	s.Services = svcs
	if s.Imports, err = k.imports.List(labels.Everything()); err != nil {
		return fmt.Errorf("list service imports: %w", err)
	}
	if s.Pods, err = k.pods.List(labels.Everything()); err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	s.Node.Name = k.nodeName
	if n, err := k.nodes.Get(k.nodeName); err == nil {
		s.Node.Region, s.Node.Zone = n.Labels[model.LabelRegion], n.Labels[model.LabelZone]
		s.Node.PodCIDRs = nil
		for _, c := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				s.Node.PodCIDRs = append(s.Node.PodCIDRs, p.Masked())
			}
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				if ip, err := netip.ParseAddr(a.Address); err == nil {
					s.Node.IP = ip
					break
				}
			}
		}
	}
	return nil
}
