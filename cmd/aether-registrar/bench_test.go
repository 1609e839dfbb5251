package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/internal/testenv"
)

// BenchmarkExportToImport measures, with two real kube-apiservers, one shared etcd registry and
// one aether-registrar process per cluster (default flags), the time from creating N
// ServiceExports in cluster east (their Services exist already) until all N ServiceImports exist,
// with their clusterset VIPs, in cluster west; and both registrars' memory at that size.
// N is AETHER_BENCH_EXPORTS (default 1000); extra registrar flags, e.g. "--kube-api-qps=200
// --kube-api-burst=400", come from AETHER_BENCH_REGISTRAR_FLAGS. Run once:
//
//	go test -run '^$' -bench BenchmarkExportToImport -benchtime 1x ./cmd/aether-registrar/
//
// Reported: s-to-west (the measure above), s-to-east (the exporting cluster's own imports),
// west-rss-MiB, west-peak-MiB, east-rss-MiB, east-peak-MiB.
func BenchmarkExportToImport(b *testing.B) {
	n := 1000
	if v := os.Getenv("AETHER_BENCH_EXPORTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("AETHER_BENCH_EXPORTS=%q: want a positive integer", v)
		}
	}
	var extra []string
	if v := os.Getenv("AETHER_BENCH_REGISTRAR_FLAGS"); v != "" {
		extra = strings.Fields(v)
	}
	etcd := testenv.StartEmbeddedEtcd(b, nil)
	type cl struct {
		api *testenv.KubeAPIServer
		c   client.Client
		p   *proc
	}
	clusters := map[string]*cl{}
	for _, name := range []string{"east", "west"} {
		api := testenv.StartTestKubeAPIServer(b, testenv.KubeAPIServerOptions{ServiceCIDR: "10.96.0.0/12"})
		testenv.InstallCRDs(b, api.Config, "deploy/crds")
		clusters[name] = &cl{api: api, c: kubeClient(b, api)}
	}
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		ns := "apps"
		if i > 0 {
			ns = "apps-" + strconv.Itoa(i)
			for _, c := range clusters {
				mustNS(b, c.c, ns)
			}
		}
		for name, c := range clusters {
			if c.p == nil {
				args := append([]string{"--cluster", name, "--kubeconfig", c.api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0],
					"--leader-elect-namespace", "aether-system"}, extra...)
				c.p = startProc(b, args...)
				testenv.Eventually(b, 60*time.Second, name+" /readyz", c.p.ready)
			}
		}
		east, west := clusters["east"], clusters["west"]
		parallel(b, n, func(j int) error { return createService(ctx, east.c, ns, j) })

		start := time.Now()
		b.ResetTimer()
		parallel(b, n, func(j int) error {
			return east.c.Create(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: objMeta(ns, j)})
		})
		var toWest, toEast time.Duration
		deadline := start.Add(10 * time.Minute)
		for toWest == 0 || toEast == 0 {
			if time.Now().After(deadline) {
				b.Fatalf("not all %d imports within 10 minutes", n)
			}
			time.Sleep(200 * time.Millisecond)
			if toWest == 0 && countImported(b, west.c, ns) == n {
				toWest = time.Since(start)
			}
			if toEast == 0 && countImported(b, east.c, ns) == n {
				toEast = time.Since(start)
			}
		}
		b.StopTimer()
		b.ReportMetric(toWest.Seconds(), "s-to-west")
		b.ReportMetric(toEast.Seconds(), "s-to-east")
		for name, c := range clusters {
			rss, peak, err := c.p.memory()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(rss)/(1<<20), name+"-rss-MiB")
			b.ReportMetric(float64(peak)/(1<<20), name+"-peak-MiB")
		}
		b.Logf("%d ServiceExports in east -> all ServiceImports in west after %s (east: %s)", n, toWest.Round(time.Millisecond), toEast.Round(time.Millisecond))
	}
}

func mustNS(t testing.TB, c client.Client, ns string) {
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
}

func objMeta(ns string, j int) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("svc-%04d", j)}
}

func createService(ctx context.Context, c client.Client, ns string, j int) error {
	return c.Create(ctx, &corev1.Service{ObjectMeta: objMeta(ns, j), Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": objMeta(ns, j).Name},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}})
}

// parallel runs fn(0..n-1) on 8 workers and fails the benchmark on the first error.
func parallel(t testing.TB, n int, fn func(int) error) {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				if err := fn(j); err != nil {
					errs <- err
				}
			}
		}()
	}
	for j := range n {
		next <- j
	}
	close(next)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// countImported counts aether's ServiceImports in ns that carry their clusterset VIP.
func countImported(t testing.TB, c client.Client, ns string) int {
	var list mcsv1beta1.ServiceImportList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, si := range list.Items {
		if len(si.Spec.IPs) > 0 {
			n++
		}
	}
	return n
}
