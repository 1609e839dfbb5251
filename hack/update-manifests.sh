#!/usr/bin/env bash
# update-manifests.sh: render the Helm chart deploy/chart/aether with its default values into the
# plain manifests under deploy/ that `kubectl apply -k deploy/` installs and the tests read
# (package deploy), with the cached Helm ($AETHER_HELM, hack/tools.sh). The chart is the one
# source: each template becomes the file of the same path under deploy/ (templates/agent/
# daemonset.yaml -> deploy/agent/daemonset.yaml, comments included), and crds/ becomes
# deploy/crds/ unchanged. verify-manifests.sh fails when deploy/ differs from this.
#
# Defaults but two: namespace.create=true, so deploy/namespace.yaml exists (with helm install
# Helm needs the namespace beforehand), and the uninstall DaemonSet, which the chart renders
# only with cniUninstall=true, rendered on its own.
#
#   hack/update-manifests.sh [outdir]   (default: deploy)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-deploy}
chart=deploy/chart/aether
namespace=aether-system
helm=${AETHER_HELM:-$(hack/tools.sh --print | sed -n 's/^AETHER_HELM=//p')}
[ -x "$helm" ] || { echo "update-manifests: no Helm at '$helm': run hack/tools.sh" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$helm" template aether "$chart" --namespace "$namespace" --include-crds \
  --set namespace.create=true --output-dir "$tmp/install" >/dev/null
# (--show-only with --output-dir finds no template in Helm v4.3.2: render all, keep one.)
"$helm" template aether "$chart" --namespace "$namespace" --set namespace.create=true \
  --set cniUninstall=true --output-dir "$tmp/all-uninstall" >/dev/null
mkdir -p "$tmp/uninstall/aether/templates/uninstall"
mv "$tmp/all-uninstall/aether/templates/uninstall/cni-uninstall.yaml" "$tmp/uninstall/aether/templates/uninstall/"

# strip FILE HEADER: drop Helm's "---" + "# Source:" lines before each document, keep "---"
# between documents, drop the blank line Helm ends each document with, and start with HEADER
# (when not empty).
strip() {
  awk -v header="$2" '
    BEGIN { if (header != "") print header }
    /^# Source: / { next }
    /^---$/ { if (docs++ > 0) sep = 1; next }
    /^$/ { blank++; next }
    {
      if (sep) { print "---"; sep = 0; blank = 0 }
      for (; blank > 0; blank--) print ""
      print
    }' "$1"
}

# The files this script owns under $out: every manifest but kustomization.yaml and the chart.
mkdir -p "$out"
find "$out" -name '*.yaml' -not -path "$out/chart/*" -not -name kustomization.yaml -delete
for src in "$tmp"/install/aether/templates "$tmp"/uninstall/aether/templates "$tmp"/install/aether/crds; do
  while IFS= read -r f; do
    rel=${f#"$src"/}
    case $src in
    */crds) dest=$out/crds/$rel header="" ;;
    *) dest=$out/$rel header="# Generated from $chart/templates/$rel (hack/update-manifests.sh)." ;;
    esac
    mkdir -p "$(dirname "$dest")"
    strip "$f" "$header" >"$dest"
  done < <(find "$src" -name '*.yaml' | sort)
done
