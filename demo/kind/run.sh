#!/usr/bin/env bash
# The kind demo: a kind cluster, Tessera's images built and loaded into it,
# the chart installed with fake GPUs (values.yaml), then the examples of
# demo/examples applied in two acts, showing where each pod landed.
#
# Needs docker, kind and kubectl; helm is built from its Go module if not on
# PATH. Run from anywhere:  demo/kind/run.sh [up|examples|down]   (default: up + examples)
# Env: CLUSTER (default tessera-demo), KIND_IMAGE (e.g. kindest/node:v1.36.0).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster=${CLUSTER:-tessera-demo}
ns=tessera-system
kctl=(kubectl --context "kind-$cluster")

log() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
need() { command -v "$1" >/dev/null || { echo "$1 is required ($2)" >&2; exit 1; }; }

helm_bin() {
	if command -v helm >/dev/null; then command -v helm; else "$root/hack/tools/helm/build.sh"; fi
}

up() {
	need docker "https://docs.docker.com/engine/install/"
	need kind "go install sigs.k8s.io/kind@latest"
	need kubectl "https://kubernetes.io/docs/tasks/tools/"
	local helm; helm=$(helm_bin)

	log "kind cluster $cluster"
	if ! kind get clusters | grep -qx "$cluster"; then
		kind create cluster --name "$cluster" --config "$here/kind-config.yaml" ${KIND_IMAGE:+--image "$KIND_IMAGE"}
	fi

	log "images"
	for target in tessera-node tessera-controller; do
		docker build -f "$here/Dockerfile" --target "$target" -t "$target:demo" "$root"
		kind load docker-image --name "$cluster" "$target:demo"
	done

	log "chart (fake GPUs: h100-sxm-8 on every worker)"
	"$helm" upgrade --install tessera "$root/chart/tessera" --kube-context "kind-$cluster" \
		--namespace "$ns" --create-namespace -f "$here/values.yaml" --wait --timeout 5m
	"${kctl[@]}" get resourceslices -o wide
}

placements() {
	"${kctl[@]}" get pods -A -l 'tessera.dev/queue' -o wide
	"${kctl[@]}" get pods -n default -o wide
	echo
	"${kctl[@]}" get resourceclaims -A \
		-o custom-columns='NAMESPACE:.metadata.namespace,CLAIM:.metadata.name,POD:.status.reservedFor[0].name,DEVICES:.status.allocation.devices.results[*].device,MEMORY:.status.allocation.devices.results[*].consumedCapacity.memory'
	echo
	"${kctl[@]}" get queues
	echo
	"${kctl[@]}" get pods -A --field-selector=status.phase=Pending \
		-o custom-columns='POD:.metadata.name,WHY:.status.conditions[?(@.type=="PodScheduled")].message'
}

examples() {
	log "act 1: team-a has the cluster to itself"
	for f in "$root"/demo/examples/0*.yaml; do "${kctl[@]}" apply -f "$f"; done
	# The MPS fraction pods must run (fake mode: tessera-mps runs the
	# built-in MPS stand-in); a pod that does not stops the demo here.
	"${kctl[@]}" -n team-a wait --for=condition=Ready pod -l app=chat --timeout=180s
	placements
	log "what a fractional pod was given (env from its CDI spec)"
	"${kctl[@]}" -n team-a logs chat-0

	log "act 2: team-b arrives; tessera-controller reclaims its quota"
	"${kctl[@]}" apply -f "$root/demo/examples/10-team-b-arrives.yaml"
	"${kctl[@]}" -n team-b wait --for=condition=PodScheduled pod/vision-train-0 pod/vision-train-1 pod/vision-train-2 --timeout=120s
	sleep 5
	placements
	"${kctl[@]}" get events -A --field-selector reason=Evicted

	log "act 3: a 20Gi share through the device plugin (no claim)"
	"${kctl[@]}" apply -f "$root/demo/examples/20-team-b-share.yaml"
	"${kctl[@]}" -n team-b wait --for=condition=Ready pod/embed --timeout=120s
	"${kctl[@]}" -n team-b get pod embed -o jsonpath='{.metadata.annotations.tessera\.dev/gpu-assignment}{"\n"}'
	"${kctl[@]}" -n team-b logs embed
}

down() { kind delete cluster --name "$cluster"; }

case ${1:-all} in
up) up ;;
examples) examples ;;
down) down ;;
all) up; examples ;;
*) echo "usage: $0 [up|examples|down]" >&2; exit 2 ;;
esac
