#!/usr/bin/env bash
# Builds the binaries of the test cluster from Go modules, once, into a cache
# keyed by version: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kwok. Prints the directory holding them.
#
# Usage: hack/build-controlplane.sh [binary...]   (default: all)
# Env:   TESSERA_CACHE (default: <repo>/_cache)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${TESSERA_CACHE:-$root/_cache}
kube_version=v1.36.3
etcd_version=v3.6.16
kwok_version=v0.8.0
bin=$cache/bin/kube-$kube_version-etcd-$etcd_version-kwok-$kwok_version
mkdir -p "$bin"

# One build at a time, even when several test packages ask at once.
exec 9>"$cache/build.lock"
flock 9

log() { echo "[build-controlplane] $*" >&2; }

build() { # name module-dir package ldflags
	local name=$1 dir=$2 pkg=$3 ldflags=${4:-}
	if [[ -x $bin/$name ]]; then return; fi
	log "building $name (cold builds take minutes; cached in $bin)"
	local start=$SECONDS
	(cd "$root/test/tools/$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$bin/$name.tmp" "$pkg")
	mv "$bin/$name.tmp" "$bin/$name"
	log "built $name in $((SECONDS - start))s"
}

kv="-s -w"
for x in gitVersion=$kube_version gitMajor=1 gitMinor=36 gitTreeState=clean; do
	kv="$kv -X k8s.io/component-base/version.$x -X k8s.io/client-go/pkg/version.$x"
done

want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
for b in "${want[@]}"; do
	case $b in
	etcd) build etcd etcd go.etcd.io/etcd/server/v3 "-s -w" ;;
	kube-apiserver | kube-controller-manager | kube-scheduler | kubelet)
		build "$b" kube "k8s.io/kubernetes/cmd/$b" "$kv" ;;
	kwok) build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$kwok_version" ;;
	*) log "unknown binary $b"; exit 2 ;;
	esac
done
echo "$bin"
