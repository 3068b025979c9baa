#!/usr/bin/env bash
# Builds the workload controllers the tests run beside the control plane
# (Kubeflow training-operator and trainer, KubeRay, JobSet, LeaderWorkerSet)
# from the Go modules pinned in test/tools/<name>/go.mod, once each, into a
# cache keyed by version: $TESSERA_CACHE/bin/<name>-<version>/ holds the
# binary <name> and, copied from the same module, crds/ (its CRDs),
# webhook/ (its webhook configurations and their kustomize patches) and,
# for trainer, runtimes/ (its ClusterTrainingRuntimes). Prints a
# folder holding a link <name> to each of those folders (the tests read it
# from TESSERA_OPERATORS_DIR).
#
# Usage: hack/build-operators.sh [name...]   (default: all)
# Env:   TESSERA_CACHE (default: <repo>/_cache)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${TESSERA_CACHE:-$root/_cache}
tools=$root/test/tools
mkdir -p "$cache/bin"

log() { echo "[build-operators] $*" >&2; }

# name -> "module main-package crd-dir webhook-dir [runtimes-dir]" (folders
# relative to the module's root).
declare -A spec=(
	[training-operator]="github.com/kubeflow/training-operator cmd/training-operator.v1 manifests/base/crds manifests/base/webhook"
	[kuberay]="github.com/ray-project/kuberay/ray-operator . config/crd/bases config/webhook"
	[jobset]="sigs.k8s.io/jobset . config/components/crd/bases config/components/webhook"
	[lws]="sigs.k8s.io/lws cmd config/crd/bases config/webhook"
	[trainer]="github.com/kubeflow/trainer/v2 cmd/trainer-controller-manager manifests/base/crds manifests/base/webhook manifests/base/runtimes"
)
all=(training-operator kuberay jobset lws trainer)

version_of() { # name module
	awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$tools/$1/go.mod"
}

build() { # name
	local name=$1 module pkg crds webhook runtimes version out start
	read -r module pkg crds webhook runtimes <<<"${spec[$name]}"
	version=$(version_of "$name" "$module")
	[[ -n $version ]] || { log "no $module version in $tools/$name/go.mod"; exit 1; }
	out=$cache/bin/$name-$version
	ln -sfn "$out" "$links/$name"
	mkdir -p "$out"
	if [[ ! -x $out/$name ]]; then
		log "building $name $version (a cold build takes minutes; cached in $out)"
		start=$SECONDS
		(cd "$tools/$name" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" \
			-o "$out/$name.tmp" "$module/${pkg#.}")
		mv "$out/$name.tmp" "$out/$name"
		log "built $name $version in $((SECONDS - start))s"
	fi
	[[ -f $out/manifests.done ]] || copy_manifests "$name" "$module" "$out" "$crds" "$webhook" "$runtimes"
}

# The manifests come from the module just built, as its release ships them
# (a flat crds/ folder; webhook/ and runtimes/ keep their layout, since
# kustomization.yaml names its patches by path).
copy_manifests() { # name module out crd-dir webhook-dir runtimes-dir
	local name=$1 module=$2 out=$3 crds=$4 webhook=$5 runtimes=${6:-} dir
	dir=$(cd "$tools/$name" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' "$module")
	rm -rf "$out/crds" "$out/webhook" "$out/runtimes" && mkdir -p "$out/crds"
	find "$dir/$crds" -maxdepth 1 -name '*.yaml' ! -name kustomization.yaml -exec cp {} "$out/crds/" \;
	cp -r "$dir/$webhook" "$out/webhook"
	[[ -z $runtimes ]] || cp -r "$dir/$runtimes" "$out/runtimes"
	chmod -R u+w "$out/crds" "$out/webhook"
	[[ -z $runtimes ]] || chmod -R u+w "$out/runtimes"
	touch "$out/manifests.done"
}

want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=("${all[@]}")
for n in "${want[@]}"; do
	[[ -n ${spec[$n]:-} ]] || { log "unknown controller $n (known: ${all[*]})"; exit 2; }
done

# The link folder is keyed by every pinned version, so worktrees pinning
# different versions do not share it.
key=$(for n in "${all[@]}"; do read -r m _ <<<"${spec[$n]}"; echo "$n-$(version_of "$n" "$m")"; done | sha256sum | cut -c1-12)
links=$cache/bin/operators-$key
mkdir -p "$links"

# One build at a time, even when several test packages ask at once: the
# machine building Kubernetes too has few cores.
exec 9>"$cache/operators-build.lock"
flock 9
for n in "${want[@]}"; do build "$n"; done
echo "$links"
