{{/*
aether.image: the image reference of a component of .Values.images: repository@digest when a
digest is set, else repository:tag, the tag defaulting to the chart's appVersion.
Call: include "aether.image" (list . "agent")
*/}}
{{- define "aether.image" -}}
{{- $root := index . 0 -}}
{{- $img := index $root.Values.images (index . 1) -}}
{{- if $img.digest -}}
{{ $img.repository }}@{{ $img.digest }}
{{- else -}}
{{ $img.repository }}:{{ $img.tag | default $root.Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
aether.pullSecrets: the pod's imagePullSecrets, nothing when .Values.imagePullSecrets is empty.
Indented for a pod spec (6 spaces).
*/}}
{{- define "aether.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
{{- end }}
{{- end -}}

{{/*
aether.configChecksum: the SHA-256 of the rendered ConfigMap aether-config. On the pod
templates it makes helm upgrade roll the pods when a setting changes: they read the ConfigMap
only when they start.
*/}}
{{- define "aether.configChecksum" -}}
{{ include (print .Template.BasePath "/config.yaml") . | sha256sum }}
{{- end -}}

{{/*
aether.checkValues: refuses values that values.schema.json cannot judge alone, naming them.
Rendered (to nothing) by config.yaml.
*/}}
{{- define "aether.checkValues" -}}
{{- $managed := dict
  "AETHER_CLUSTER" "cluster" "AETHER_REGISTRY_ENDPOINTS" "registry.endpoints" "AETHER_REGION" "region"
  "AETHER_MESH_DOMAIN" "meshDomain" "AETHER_TRUST_DOMAIN" "trustDomain" "AETHER_INBOUND_MODE" "inboundMode"
  "AETHER_EAST_WEST_WAYPOINT" "eastWestWaypoint" "AETHER_LOG_LEVEL" "logLevel"
  "AETHER_CONTROL_CLUSTER" "controlCluster" "AETHER_IMPORT_CONFIG" "importConfig"
  "AETHER_REGISTRY_CA" "registry.tls" "AETHER_REGISTRY_CERT" "registry.tls" "AETHER_REGISTRY_KEY" "registry.tls"
  "AETHER_REGISTRY_INSECURE" "registry.insecure" "AETHER_REGISTRY_USER" "registry.user"
  "AETHER_REGISTRY_PASSWORD" "registry.passwordSecret"
  "AETHER_CAPTURE_BACKEND" "agent.captureBackend" "AETHER_CAPTURE_MODE" "agent.captureMode"
  "AETHER_CLUSTER_DNS" "agent.clusterDNS"
  "AETHER_CLUSTER_DOMAIN" "agent.clusterDomain" "AETHER_DNS_CACHE_SIZE" "agent.dnsCache.size"
  "AETHER_DNS_CACHE_MAX_TTL" "agent.dnsCache.maxTTL" "AETHER_DNS_CACHE_MAX_NEGATIVE_TTL" "agent.dnsCache.maxNegativeTTL"
  "AETHER_DNS_CACHE_SERVE_STALE" "agent.dnsCache.serveStale" "AETHER_DNS_CACHE_PREFETCH" "agent.dnsCache.prefetch"
  "AETHER_CA_CERT" "identity (the CA Secret's mount)" "AETHER_CA_KEY" "identity (the CA Secret's mount)"
  "AETHER_IDENTITY_SOURCE" "identity.mode" "AETHER_SPIRE_ADMIN_SOCKET" "identity.mode (the SPIRE agent's admin socket)"
  "AETHER_CLUSTERSET_TRUST_DOMAINS" "spire.clusterset.federatesWith" }}
{{- range $k, $v := .Values.extraConfig }}
{{- if hasKey $managed $k }}
{{- fail (printf "extraConfig.%s: set by the value %s; set that value instead" $k (get $managed $k)) }}
{{- end }}
{{- end }}
{{- if and .Values.registry.passwordSecret.name (not .Values.registry.user) }}
{{- fail (printf "registry.passwordSecret.name %q: a password needs registry.user (the registrar's etcd user)" .Values.registry.passwordSecret.name) }}
{{- end }}
{{- if and (not .Values.mesh.enabled) (ne .Values.identity.mode "spire") }}
{{- fail (printf "mesh.enabled false with identity.mode %q: the chart would install nothing (mesh.enabled false installs only SPIRE, identity.mode spire)" .Values.identity.mode) }}
{{- end }}
{{- if eq .Values.identity.mode "spire" }}
{{- if eq .Values.spire.namespace .Release.Namespace }}
{{- fail (printf "spire.namespace %q is the release namespace: SPIRE needs a namespace of its own (the Controller Manager registers no pod of SPIRE's namespace, and the aether agents' entries are in the release namespace)" .Values.spire.namespace) }}
{{- end }}
{{- end }}
{{- $cs := .Values.spire.clusterset }}
{{- if and (ne .Values.identity.mode "spire") (ne $cs.mode "") }}
{{- fail (printf "spire.clusterset.mode %q needs identity.mode spire (with %q every cluster signs with the same development CA: one trust domain already)" $cs.mode .Values.identity.mode) }}
{{- end }}
{{- if and $cs.federatesWith (ne $cs.mode "federation") }}
{{- fail (printf "spire.clusterset.federatesWith names %d trust domains with spire.clusterset.mode %q: they are for mode federation" (len $cs.federatesWith) $cs.mode) }}
{{- end }}
{{- $seen := dict }}
{{- range $i, $f := $cs.federatesWith }}
{{- if eq $f.trustDomain $.Values.trustDomain }}
{{- fail (printf "spire.clusterset.federatesWith[%d].trustDomain %q is this cluster's trustDomain: with federation each cluster has a trust domain of its own" $i $f.trustDomain) }}
{{- end }}
{{- $name := include "aether.federatedTrustDomainName" $f.trustDomain }}
{{- if hasKey $seen $name }}
{{- fail (printf "spire.clusterset.federatesWith[%d].trustDomain %q: named twice" $i $f.trustDomain) }}
{{- end }}
{{- $_ := set $seen $name true }}
{{- $b := fromJson $f.trustDomainBundle }}
{{- $x509 := false }}
{{- if and (not (hasKey $b "Error")) (kindIs "slice" (get $b "keys")) }}
{{- range (get $b "keys") }}{{ if and (kindIs "map" .) (eq (get . "use") "x509-svid") (get . "x5c") }}{{ $x509 = true }}{{ end }}{{ end }}
{{- end }}
{{- if not $x509 }}
{{- fail (printf "spire.clusterset.federatesWith[%d].trustDomainBundle: not a SPIFFE bundle with an X.509 authority (JSON whose \"keys\" hold one of use x509-svid with x5c, as spire-server bundle show -format spiffe prints it)" $i) }}
{{- end }}
{{- end }}
{{- $be := $cs.bundleEndpoint }}
{{- if and (eq $cs.mode "federation") (has (int $be.port) (list 8080 8081 8083)) }}
{{- fail (printf "spire.clusterset.bundleEndpoint.port %d: taken in the SPIRE server's pod (8081 its API, 8080 its health, 8083 the Controller Manager's health)" (int $be.port)) }}
{{- end }}
{{- if and (eq $be.service.type "ClusterIP") (not (kindIs "invalid" $be.service.nodePort)) }}
{{- fail (printf "spire.clusterset.bundleEndpoint.service.nodePort %v with type ClusterIP: a node port needs type NodePort or LoadBalancer" $be.service.nodePort) }}
{{- end }}
{{- if and (eq .Values.identity.mode "spire") (eq $cs.mode "sharedTrustDomain") }}
{{- $sec := lookup "v1" "Secret" .Values.spire.namespace $cs.upstreamAuthority.secretName }}
{{- if $sec }}
{{- if eq $sec.type "kubernetes.io/tls" }}
{{- fail (printf "spire.clusterset.upstreamAuthority.secretName %q: a kubernetes.io/tls Secret, which aether's registrar caches for edge Gateway listeners; make it Opaque (kubectl create secret generic) with the keys upstream-ca.crt and upstream-ca.key" $cs.upstreamAuthority.secretName) }}
{{- end }}
{{- $keys := list "upstream-ca.crt" "upstream-ca.key" }}
{{- if $cs.upstreamAuthority.intermediate }}{{ $keys = append $keys "upstream-roots.crt" }}{{ end }}
{{- range $keys }}
{{- if not (hasKey ($sec.data | default dict) .) }}
{{- fail (printf "spire.clusterset.upstreamAuthority.secretName %q has no key %s (keys: upstream-ca.crt, upstream-ca.key, and upstream-roots.crt with intermediate)" $cs.upstreamAuthority.secretName .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq .Values.identity.mode "spire" }}
{{- if has .Release.Namespace .Values.spire.controllerManager.ignoreNamespaces }}
{{- fail (printf "spire.controllerManager.ignoreNamespaces names the release namespace %q: the aether agents' own registration entries (the SPIRE agents' authorized delegate) are there" .Release.Namespace) }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
aether.spireLogLevel: logLevel as SPIRE spells it (DEBUG, INFO, WARN, ERROR).
*/}}
{{- define "aether.spireLogLevel" -}}
{{ upper .Values.logLevel }}
{{- end -}}

{{/*
aether.spireSocket: paths SPIRE's processes share. server: the SPIRE server API's socket (the
Controller Manager and the CLI in the server pod); admin: the SPIRE agent's admin socket on the
node (the Delegated Identity API; agent.DefaultSPIREAdminSocket); workload: its Workload API
socket on the node.
Call: include "aether.spireSocket" "admin"
*/}}
{{- define "aether.spireSocket" -}}
{{- get (dict "server" "/run/spire/server-api/api.sock" "admin" "/run/spire/agent-admin/admin.sock" "workload" "/run/spire/agent-sockets/spire-agent.sock") . -}}
{{- end -}}

{{/*
aether.spiffeIDTemplate: the ClusterSPIFFEID template of the mesh's identities,
spiffe://<trust domain>/ns/<namespace>/sa/<service account>, which the Controller Manager renders
per pod (text/template, its own data: .TrustDomain, .PodMeta, .PodSpec).
*/}}
{{- define "aether.spiffeIDTemplate" -}}
spiffe://{{ "{{ .TrustDomain }}" }}/ns/{{ "{{ .PodMeta.Namespace }}" }}/sa/{{ "{{ .PodSpec.ServiceAccountName }}" }}
{{- end -}}

{{/*
aether.spireChecksum: the SHA-256 of SPIRE's rendered configuration (the settings ConfigMap
aether-spire-settings, and spire/config.yaml, the configuration files). On
SPIRE's pod templates it makes helm upgrade roll them when it changes: they read it only when
they start.
*/}}
{{- define "aether.spireChecksum" -}}
{{ print (include "aether.spireSettings" .) (include (print .Template.BasePath "/spire/config.yaml") .) | sha256sum }}
{{- end -}}

{{/*
aether.spireSettings: the ConfigMap aether-spire-settings (identity.mode spire), rendered by
config.yaml beside aether-config. On its own so that SPIRE's checksum covers it and not
aether-config: a change of aether's settings (spire.clusterset.federatesWith's trust domains among
them) rolls the aether agents, never the SPIRE server, whose restart with an emptyDir data volume
would make a new CA.
*/}}
{{- define "aether.spireSettings" -}}
# aether-spire-settings: this cluster's settings for SPIRE (identity.mode spire), in SPIRE's
# namespace. The SPIRE server, its Controller Manager and the SPIRE agents read them as
# environment and expand them in their configuration files (spire/config.yaml; -expandEnv,
# -expand-env). Keep them equal to AETHER_CLUSTER and AETHER_TRUST_DOMAIN of aether-config (the
# chart writes both from the values cluster and trustDomain). After a change applied with
# kubectl, restart SPIRE:
#   kubectl -n {{ .Values.spire.namespace }} rollout restart statefulset/spire-server daemonset/spire-agent
apiVersion: v1
kind: ConfigMap
metadata:
  name: aether-spire-settings
  namespace: {{ .Values.spire.namespace }}
  labels:
    app.kubernetes.io/part-of: aether
data:
  # The cluster's name for SPIRE: the k8s_psat node attestor's (server and agents; an agent's
  # SPIFFE ID is spiffe://<trust domain>/spire/agent/k8s_psat/<cluster>/<node UID>) and the
  # Controller Manager's. Empty: the SPIRE agents and the Controller Manager exit at start.
  AETHER_CLUSTER: {{ .Values.cluster | quote }}
  # The trust domain of every SVID the server issues (spiffe://<trust domain>/ns/<ns>/sa/<sa>).
  AETHER_TRUST_DOMAIN: {{ .Values.trustDomain | quote }}
{{- end -}}


{{/*
aether.spireNotes: what NOTES.txt says of SPIRE (identity.mode spire; nothing otherwise): what to
check, and what would keep it from starting.
*/}}
{{- define "aether.spireNotes" -}}
{{- if eq .Values.identity.mode "spire" }}
{{- $sns := .Values.spire.namespace }}
{{- $sock := include "aether.spireSocket" "server" }}
{{- if and (eq .Values.spire.server.dataVolume.type "persistentVolumeClaim") (not .Values.spire.server.dataVolume.storageClassName) (lookup "v1" "Namespace" "" .Release.Namespace) }}
{{- $default := false }}
{{- range (lookup "storage.k8s.io/v1" "StorageClass" "" "").items }}
{{- if eq (index (.metadata.annotations | default dict) "storageclass.kubernetes.io/is-default-class" | default "") "true" }}
{{- $default = true }}
{{- end }}
{{- end }}
{{- if not $default }}

WARNING: the cluster has no default StorageClass: the SPIRE server's volume claim (data-spire-server-0)
stays Pending, and so does the server. Set spire.server.dataVolume.storageClassName, or
spire.server.dataVolume.type=emptyDir (the server's CA and registrations then die with its pod).
{{- end }}
{{- end }}

{{- if not (include "aether.spiffeIDsRenderable" .) }}

WARNING: the cluster has no ClusterSPIFFEID CRD (a dry run, or --skip-crds): the ClusterSPIFFEIDs
aether-workloads and aether-agent are left out, and no pod would get an SVID. Create the CRDs
(kubectl apply --server-side -f deploy/chart/aether/crds/), then helm upgrade.
{{- end }}

SPIRE issues the workload identities (identity.mode spire, trust domain {{ .Values.trustDomain }}). Check it:
  kubectl -n {{ $sns }} rollout status statefulset/spire-server
  kubectl -n {{ $sns }} rollout status daemonset/spire-agent
  # one attested agent per node (spiffe://{{ .Values.trustDomain }}/spire/agent/k8s_psat/{{ .Values.cluster | default "<cluster>" }}/<node UID>):
  kubectl -n {{ $sns }} exec spire-server-0 -c spire-server -- spire-server agent list -socketPath {{ $sock }}
  # the entries of the aether agents (their authorized delegate ID) and of the meshed pods:
  kubectl -n {{ $sns }} exec spire-server-0 -c spire-server -- spire-server entry show -socketPath {{ $sock }}
  kubectl get clusterspiffeids aether-agent aether-workloads aether-edge -o wide
{{- $cs := .Values.spire.clusterset }}
{{- if eq $cs.mode "sharedTrustDomain" }}

One trust domain for the clusterset (spire.clusterset.mode sharedTrustDomain): the SPIRE server signs
under the upstream authority of the Secret {{ $sns }}/{{ $cs.upstreamAuthority.secretName }}; until it exists the server does not
start. Every cluster's bundle then holds the same root:
  kubectl -n {{ $sns }} exec spire-server-0 -c spire-server -- spire-server bundle show -socketPath {{ $sock }}
{{- end }}
{{- if eq $cs.mode "federation" }}

Federation (spire.clusterset.mode federation): this cluster's bundle endpoint is the Service
{{ $sns }}/spire-server-bundle-endpoint ({{ $cs.bundleEndpoint.service.type }}, port {{ $cs.bundleEndpoint.port }}), authenticated as spiffe://{{ .Values.trustDomain }}/spire/server.
Give the other clusters its URL and this bundle (their spire.clusterset.federatesWith[].trustDomainBundle):
  kubectl -n {{ $sns }} exec spire-server-0 -c spire-server -- spire-server bundle show -format spiffe -socketPath {{ $sock }}
{{- if or (eq .Values.spire.server.dataVolume.type "emptyDir") (eq .Values.spire.server.keyManager "memory") }}

WARNING: federation with the SPIRE server's CA key in {{ if eq .Values.spire.server.keyManager "memory" }}memory{{ else }}an emptyDir{{ end }}: a restart of spire-server-0 makes a new CA,
and the other clusters' servers, which hold the old bundle, no longer accept this bundle endpoint
(a ClusterFederatedTrustDomain's trustDomainBundle is used only when it is created). Then give
them the new bundle: in each other cluster
  kubectl -n {{ $sns }} exec spire-server-0 -c spire-server -- spire-server bundle set -id spiffe://{{ .Values.trustDomain }} -format spiffe -socketPath {{ $sock }} < {{ .Values.trustDomain }}.json
{{- end }}
{{- if $cs.federatesWith }}
Federated with:{{ range $cs.federatesWith }} {{ .trustDomain }}{{ end }}; the bundles this server holds of them:
  kubectl -n {{ $sns }} exec spire-server-0 -c spire-server -- spire-server bundle list -socketPath {{ $sock }}
  kubectl get clusterfederatedtrustdomains
{{- else }}
Federated with no trust domain yet: set spire.clusterset.federatesWith and helm upgrade.
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
aether.spiffeIDsRenderable: "true" unless the chart talks to a cluster (lookup finds the release
namespace) that lacks the ClusterSPIFFEID CRD. helm install creates the chart's crds/ before it
renders, so only a server-side dry run (which creates no CRD) or --skip-crds gets there; the
ClusterSPIFFEIDs are then left out rather than failing the whole release, and NOTES.txt warns.
helm template (no cluster) renders them.
*/}}
{{- define "aether.spiffeIDsRenderable" -}}
{{- if or (.Capabilities.APIVersions.Has "spire.spiffe.io/v1alpha1/ClusterSPIFFEID") (not (lookup "v1" "Namespace" "" .Release.Namespace)) -}}
true
{{- end -}}
{{- end -}}

{{/*
aether.spireFederatesWith: the federatesWith of the chart's ClusterSPIFFEIDs: the trust domains of
spire.clusterset.federatesWith (mode federation), whose bundles the SVIDs then carry; nothing
otherwise.
*/}}
{{- define "aether.spireFederatesWith" -}}
{{- if and (eq .Values.spire.clusterset.mode "federation") .Values.spire.clusterset.federatesWith }}
  federatesWith:
  {{- range .Values.spire.clusterset.federatesWith }}
    - {{ .trustDomain }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
aether.clustersetTrustDomains: the other clusters' trust domains, comma-separated (mode
federation; empty otherwise): the agents' --clusterset-trust-domains.
*/}}
{{- define "aether.clustersetTrustDomains" -}}
{{- if eq .Values.spire.clusterset.mode "federation" -}}
{{- $tds := list }}
{{- range .Values.spire.clusterset.federatesWith }}{{ $tds = append $tds .trustDomain }}{{ end }}
{{- join "," $tds }}
{{- end -}}
{{- end -}}

{{/*
aether.federatedTrustDomainName: the name of the ClusterFederatedTrustDomain of trust domain td
(spire.clusterset.federatesWith): td with '.' and '_' as '-', and the first 8 hex digits of its
SHA-256, so that two trust domains never share a name (beta-x.org and beta.x.org).
Call: include "aether.federatedTrustDomainName" "beta.example.org"
*/}}
{{- define "aether.federatedTrustDomainName" -}}
{{ printf "%s-%s" (. | replace "." "-" | replace "_" "-" | trimAll "-" | trunc 50 | trimSuffix "-") (sha256sum . | trunc 8) }}
{{- end -}}
