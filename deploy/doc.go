// Package deploy holds aether's Helm chart (chart/aether) and the Kubernetes manifests rendered
// from it with its default values by hack/update-manifests.sh (namespace, MCS and Gateway API
// CRDs, RBAC, the agent DaemonSet with its Envoy container, the registrar Deployment, the
// configuration ConfigMap and the CNI uninstall DaemonSet), embedded so tests read exactly the
// shipped files, and the small helpers those tests share: decoding the manifests, rendering the
// chart (embedded too) with a given Helm binary and values (RenderChart, OtherValues) and
// computing a container's environment and arguments the way the kubelet does. Its tests run the
// real Helm on the chart (lint, template with default and other values, install on a real
// kube-apiserver).
//
// It owns the chart and the YAML under deploy/ and nothing else: the flags the manifests pass
// are defined and parsed by packages agent and registrar (run by cmd/aether-agent and
// cmd/aether-registrar), whose tests parse these manifests' args, and those of the chart rendered
// with OtherValues, with the binaries' own flag parsers (deploy imports neither: it is in the
// lowest tier); the images they name are built from images/.
package deploy
