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
  "AETHER_CAPTURE_BACKEND" "agent.captureBackend" "AETHER_CLUSTER_DNS" "agent.clusterDNS"
  "AETHER_CLUSTER_DOMAIN" "agent.clusterDomain" "AETHER_DNS_CACHE_SIZE" "agent.dnsCache.size"
  "AETHER_DNS_CACHE_MAX_TTL" "agent.dnsCache.maxTTL" "AETHER_DNS_CACHE_MAX_NEGATIVE_TTL" "agent.dnsCache.maxNegativeTTL"
  "AETHER_DNS_CACHE_SERVE_STALE" "agent.dnsCache.serveStale" "AETHER_DNS_CACHE_PREFETCH" "agent.dnsCache.prefetch"
  "AETHER_CA_CERT" "identity (the CA Secret's mount)" "AETHER_CA_KEY" "identity (the CA Secret's mount)" }}
{{- range $k, $v := .Values.extraConfig }}
{{- if hasKey $managed $k }}
{{- fail (printf "extraConfig.%s: set by the value %s; set that value instead" $k (get $managed $k)) }}
{{- end }}
{{- end }}
{{- if and .Values.registry.passwordSecret.name (not .Values.registry.user) }}
{{- fail (printf "registry.passwordSecret.name %q: a password needs registry.user (the registrar's etcd user)" .Values.registry.passwordSecret.name) }}
{{- end }}
{{- end -}}
