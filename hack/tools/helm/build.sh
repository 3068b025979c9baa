#!/usr/bin/env bash
# Builds helm from its Go module (the version pinned in this folder's go.mod),
# once, into a cache keyed by version, and prints the binary's path.
# Env: TESSERA_CACHE (default: <repo>/_cache)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cache=${TESSERA_CACHE:-$root/_cache}
version=$(cd "$here" && awk '$1 == "helm.sh/helm/v3" { print $2; exit } $2 == "helm.sh/helm/v3" { print $3; exit }' go.mod)
[[ -n $version ]] || { echo "[build-helm] no helm.sh/helm/v3 version in $here/go.mod" >&2; exit 1; }
# The Kubernetes version helm assumes without a cluster (helm template,
# lint) comes from its client-go, as helm's own Makefile stamps it.
kminor=$(cd "$here" && awk '$1 == "k8s.io/client-go" { split($2, v, "."); print v[2]; exit }' go.mod)
out=$cache/bin/helm-$version-k8s-1.$kminor
mkdir -p "$out"

exec 9>"$cache/helm-build.lock"
flock 9
if [[ ! -x $out/helm ]]; then
	echo "[build-helm] building helm $version (a cold build takes a few minutes; cached in $out)" >&2
	start=$SECONDS
	(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
		-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version \
			-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$kminor \
			-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kminor" \
		-o "$out/helm.tmp" helm.sh/helm/v3/cmd/helm)
	mv "$out/helm.tmp" "$out/helm"
	echo "[build-helm] built helm in $((SECONDS - start))s" >&2
fi
echo "$out/helm"
