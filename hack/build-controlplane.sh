#!/usr/bin/env bash
# Builds the binaries of the test cluster from Go modules, once, into a cache
# keyed by version: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kwok, for the real node containerd,
# containerd-shim-runc-v2 and ctr, and on request kubectl (the kept demo's,
# `make demo KEEP=1`). Prints the directory holding them.
#
# Usage: hack/build-controlplane.sh [binary...]   (default: all)
# Env:   TESSERA_CACHE (default: <repo>/_cache)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${TESSERA_CACHE:-$root/_cache}
kube_version=v1.37.2
etcd_version=v3.6.16
kwok_version=v0.8.0
containerd_version=v2.4.2 # keep in step with test/tools/containerd/go.mod
bin=$cache/bin/kube-$kube_version-etcd-$etcd_version-kwok-$kwok_version
# containerd has its own version-keyed folder, so bumping it does not rebuild
# Kubernetes; the printed folder links to it.
cbin=$cache/bin/containerd-$containerd_version
mkdir -p "$bin" "$cbin"

# One build at a time, even when several test packages ask at once.
exec 9>"$cache/build.lock"
flock 9

log() { echo "[build-controlplane] $*" >&2; }

build() { # name module-dir package ldflags [out-dir]
	local name=$1 dir=$2 pkg=$3 ldflags=${4:-} out=${5:-$bin}
	if [[ -x $out/$name ]]; then return; fi
	log "building $name (cold builds take minutes; cached in $out)"
	local start=$SECONDS
	(cd "$root/test/tools/$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg")
	mv "$out/$name.tmp" "$out/$name"
	log "built $name in $((SECONDS - start))s"
}

# containerd's binaries: static (CGO_ENABLED=0, which the shim needs to run
# inside any mount namespace), then linked into the printed folder.
build_containerd() { # name
	local name=$1
	build "$name" containerd "github.com/containerd/containerd/v2/cmd/$name" \
		"-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" "$cbin"
	ln -sfn "$cbin/$name" "$bin/$name"
}

kv="-s -w"
for x in gitVersion=$kube_version gitMajor=1 gitMinor=37 gitTreeState=clean; do
	kv="$kv -X k8s.io/component-base/version.$x -X k8s.io/client-go/pkg/version.$x"
done

want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
for b in "${want[@]}"; do
	case $b in
	etcd) build etcd etcd go.etcd.io/etcd/server/v3 "-s -w" ;;
	kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kubectl)
		build "$b" kube "k8s.io/kubernetes/cmd/$b" "$kv" ;;
	kwok) build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$kwok_version" ;;
	containerd | containerd-shim-runc-v2 | ctr) build_containerd "$b" ;;
	*) log "unknown binary $b"; exit 2 ;;
	esac
done
echo "$bin"
