#!/usr/bin/env bash
# up.sh: two kind clusters with Flannel (kind's default CNI disabled), the shared registry etcd
# as a container on the kind network, aether's images built from images/ and loaded, and the
# chart deploy/chart/aether installed in both clusters with one development CA (identity.mode
# dev-ca: the agent's SPIRE wiring, issue #28, is not in yet; deploy/ is the chart rendered for
# SPIRE). Idempotent: run it again to rebuild and reinstall (AETHER_KIND_SKIP_BUILD=1 reuses the
# images). Settings: lib.sh. Needs Docker, kind ($KIND_VERSION), kubectl, Helm ($HELM_VERSION),
# openssl and curl; it cannot run where there is no Docker engine (make e2e runs the same
# scenarios on the local substrate there).
set -euo pipefail
# shellcheck source=e2e/kind/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

need docker kind kubectl helm openssl curl tar
mkdir -p "$WORK"

create_cluster() {
  local c=$1 cfg i
  if kind get clusters | grep -qx "$c"; then
    log "cluster $c exists"
  else
    cfg="$WORK/kind-$c.yaml"
    {
      echo "kind: Cluster"
      echo "apiVersion: kind.x-k8s.io/v1alpha4"
      echo "networking:"
      echo "  disableDefaultCNI: true"
      echo "  podSubnet: $(pod_cidr "$c")"
      echo "  serviceSubnet: $(service_cidr "$c")"
      echo "nodes:"
      echo "  - role: control-plane"
      for ((i = 0; i < WORKERS; i++)); do echo "  - role: worker"; done
    } >"$cfg"
    log "creating cluster $c"
    kind create cluster --name "$c" --config "$cfg" --kubeconfig "$(kubeconfig "$c")" \
      ${AETHER_KIND_NODE_IMAGE:+--image "$AETHER_KIND_NODE_IMAGE"}
  fi
  kind get kubeconfig --name "$c" >"$(kubeconfig "$c")"
}

# install_cni_plugins CLUSTER: kind's node image lacks the bridge plugin Flannel delegates to;
# install the pinned CNI plugins release into every node's /opt/cni/bin.
install_cni_plugins() {
  local c=$1 arch tgz node
  arch=$(docker info -f '{{.Architecture}}')
  case "$arch" in x86_64 | amd64) arch=amd64 ;; aarch64 | arm64) arch=arm64 ;; esac
  tgz="$WORK/cni-plugins-linux-$arch-$CNI_PLUGINS_VERSION.tgz"
  if [ ! -s "$tgz" ]; then
    curl -fsSL -o "$tgz.tmp" "https://github.com/containernetworking/plugins/releases/download/$CNI_PLUGINS_VERSION/cni-plugins-linux-$arch-$CNI_PLUGINS_VERSION.tgz"
    mv "$tgz.tmp" "$tgz"
  fi
  for node in $(kind get nodes --name "$c"); do
    docker cp "$tgz" "$node:/tmp/cni-plugins.tgz"
    docker exec "$node" tar -C /opt/cni/bin -xzf /tmp/cni-plugins.tgz
  done
}

install_flannel() {
  local c=$1 manifest="$WORK/kube-flannel-$FLANNEL_VERSION.yml"
  if [ ! -s "$manifest" ]; then
    curl -fsSL -o "$manifest.tmp" "https://github.com/flannel-io/flannel/releases/download/$FLANNEL_VERSION/kube-flannel.yml"
    mv "$manifest.tmp" "$manifest"
  fi
  log "installing Flannel $FLANNEL_VERSION in $c (pod CIDR $(pod_cidr "$c"))"
  sed "s|10.244.0.0/16|$(pod_cidr "$c")|g" "$manifest" | kc "$c" apply -f -
  kc "$c" wait --for=condition=Ready nodes --all --timeout=5m
}

start_registry() {
  if [ -z "$(docker ps -q -f "name=^$REGISTRY\$")" ]; then
    docker rm -f "$REGISTRY" >/dev/null 2>&1 || true
    log "starting the shared registry etcd $ETCD_VERSION as container $REGISTRY"
    docker run -d --name "$REGISTRY" --network "$KIND_NETWORK" "quay.io/coreos/etcd:$ETCD_VERSION" \
      /usr/local/bin/etcd --name registry --data-dir /tmp/registry \
      --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls http://127.0.0.1:2379 >/dev/null
  fi
  registry_endpoint >/dev/null
}

build_images() {
  local entry tag file
  for entry in "${IMAGES[@]}"; do
    read -r tag file <<<"$entry"
    if [ "${AETHER_KIND_SKIP_BUILD:-}" = 1 ] && docker image inspect "$tag" >/dev/null 2>&1; then
      continue
    fi
    log "building $tag from $file"
    docker build -f "$ROOT/$file" -t "$tag" "$ROOT"
  done
}

load_images() {
  local c=$1 entry tag file
  for entry in "${IMAGES[@]}"; do
    read -r tag file <<<"$entry"
    kind load docker-image "$tag" --name "$c"
  done
}

# make_ca: the development CA both clusters share (the agents sign workload SVIDs with it).
make_ca() {
  [ -s "$WORK/ca.key" ] && return
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj "/CN=aether-kind-ca" -keyout "$WORK/ca.key" -out "$WORK/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

install_aether() {
  local c=$1
  log "installing aether in $c"
  kc "$c" apply -f "$ROOT/deploy/namespace.yaml"
  kc "$c" -n aether-system create secret tls aether-ca --cert "$WORK/ca.crt" --key "$WORK/ca.key" \
    --dry-run=client -o yaml | kc "$c" apply -f -
  # The chart with this cluster's settings and the development CA, explicitly: the chart's
  # default is SPIRE, and the agent's SPIRE wiring is not in yet (issue #28). The kind registry
  # is a plaintext etcd container on the docker network (no certificates set up for it), so
  # plaintext off loopback is allowed explicitly; a real install uses https://.
  helm template aether "$ROOT/deploy/chart/aether" --namespace aether-system --include-crds \
    --set identity.mode=dev-ca --set cluster="$c" --set "registry.endpoints={$(registry_endpoint)}" \
    --set registry.insecure=true --set logLevel="${AETHER_KIND_LOG_LEVEL:-info}" |
    kc "$c" apply --server-side --force-conflicts -f -
  # A rerun may have changed the configuration or the images: restart to pick them up.
  kc "$c" -n aether-system rollout restart daemonset/aether-agent deployment/aether-registrar
  kc "$c" -n aether-system rollout status daemonset/aether-agent --timeout=5m
  kc "$c" -n aether-system rollout status deployment/aether-registrar --timeout=5m
}

for c in "${CLUSTERS[@]}"; do
  create_cluster "$c"
  install_cni_plugins "$c"
  install_flannel "$c"
done
start_registry
build_images
make_ca
for c in "${CLUSTERS[@]}"; do
  load_images "$c"
  install_aether "$c"
done
log "ready: kubeconfigs $(kubeconfig "${CLUSTERS[0]}") and $(kubeconfig "${CLUSTERS[1]}"); registry $(registry_endpoint)"
