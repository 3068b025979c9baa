# Tessera. `make test` runs every test; `make demo` runs the local demo.
SHELL := /usr/bin/env bash
GO ?= go
BIN := $(CURDIR)/bin
export TESSERA_CACHE ?= $(CURDIR)/_cache
COMMANDS := $(notdir $(wildcard cmd/*))
# Go test timeout: the integration packages start a real control plane.
TEST_TIMEOUT ?= 40m

VERSION ?= $(shell cat VERSION)
# Release platforms of `make images`; PLATFORMS=linux/amd64 builds one.
PLATFORMS ?= linux/amd64,linux/arm64

.PHONY: images push-images real-gpu all build test unit lint controlplane operators scenarios clean generate scale soak demo demo-down helm chart-sync chart-check fuzz

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "-X github.com/tessera-gpu/tessera/internal/version.Version=$(VERSION)" -o $(BIN)/ $(addprefix ./cmd/,$(COMMANDS))

# OCI images of tessera-node and tessera-controller for PLATFORMS (one index
# each) and the kubectl plugin's binaries, tagged VERSION, without Docker or a
# registry (internal/images/README.md): written to _cache/images/VERSION as
# OCI layouts and archives (`ctr -n k8s.io images import --all-platforms`).
# Installs Debian's cross compiler for cgo when an arm64 image is asked for.
images:
	hack/images/cross-compiler.sh $(PLATFORMS)
	$(GO) run ./hack/images build --version $(VERSION) --platforms $(PLATFORMS)

# Pushes what `make images` built: make push-images REGISTRY=registry.example.com/gpu
# (credentials from ~/.docker/config.json, e.g. written by `crane auth login`).
push-images:
	@test -n "$(REGISTRY)" || { echo "REGISTRY=host[/path] is required"; exit 1; }
	$(GO) run ./hack/images push --registry $(REGISTRY) --dir $(TESSERA_CACHE)/images/$(VERSION)

# The test cluster's binaries, built from Go modules once and cached by version.
controlplane:
	hack/build-controlplane.sh

# The workload controllers the tests run beside it (Kubeflow training-operator
# and trainer, KubeRay, JobSet, LeaderWorkerSet), built the same way.
operators:
	hack/build-operators.sh

test: controlplane operators chart-check
	TESSERA_BIN_DIR=$$(hack/build-controlplane.sh) TESSERA_OPERATORS_DIR=$$(hack/build-operators.sh) TESSERA_HELM=$$(hack/tools/helm/build.sh) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(MAKE) scenarios

# Unit tests only: no control plane needed.
unit:
	$(GO) test -count=1 -short ./...

scenarios:
	@if [ -d controller/testdata/scenarios ]; then \
		$(GO) run ./cmd/tessera-sim run controller/testdata/scenarios/*.yaml; \
	fi

# Fuzzes every Go fuzz target in the repository for FUZZTIME each, one after
# the other (hack/fuzz.sh finds them); fails when one finds a failing input.
# `test` runs their seed corpora. FUZZ=regexp picks targets.
FUZZTIME ?= 10m
fuzz:
	FUZZTIME=$(FUZZTIME) hack/fuzz.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf $(BIN) $(TESSERA_CACHE)

# Regenerate deepcopy and CRD manifests (controller-tools, pinned in hack/tools).
CONTROLLER_GEN := cd hack/tools && GOFLAGS=-mod=mod $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen
generate:
	$(CONTROLLER_GEN) object:headerFile=/dev/null paths=$(CURDIR)/api/scheduling/... 
	$(CONTROLLER_GEN) crd paths=$(CURDIR)/api/scheduling/... output:crd:artifacts:config=$(CURDIR)/api/scheduling/crds

# The scale benchmark (issue 5): 500 kwok nodes × 8 GPUs filled with 4,000 DRA
# pods by tessera-scheduler and by kube-scheduler, and the API server's write
# ceiling, in one run. Takes minutes and the whole machine; not part of `test`.
scale: controlplane
	TESSERA_SCALE=1 TESSERA_BIN_DIR=$$(hack/build-controlplane.sh) $(GO) test -count=1 -timeout 60m -v -run TestScale ./test/scale/ 2>&1 | grep -E '^(=== RUN|--- |\s+scale_test.go|ok|FAIL|PASS)'

# The chaos soak (test/soak/README.md): pods, gangs, fractions and deletions
# from several queues on kwok nodes with tessera-node processes, while
# controller replicas, tessera-node and the API server are killed at random;
# invariants checked after every event. `make test` runs a 2.5-minute
# version; DURATION sets the length, SEED replays a run. The test bounds
# itself (its duration plus 10 minutes), so go test's timeout is off.
DURATION ?= 30m
soak: controlplane
	TESSERA_SOAK_DURATION=$(DURATION) TESSERA_SOAK_SEED=$(SEED) TESSERA_BIN_DIR=$$(hack/build-controlplane.sh) $(GO) test -count=1 -timeout 0 -v -run '^TestSoak$$' ./test/soak/

# The real-GPU checks (test/realgpu/README.md): NVML, MPS limits seen by a CUDA
# program, time-slicing, CDI against the installed driver. They change GPU
# state, so they need root, an idle GPU and nvcc; not part of `test`.
real-gpu:
	TESSERA_REAL_GPU=1 $(GO) test -count=1 -v ./test/realgpu/ ./gpu/ -run 'Test(InventoryAndSlice|MPSEnforcesClaimLimits|DevicePluginShares|TimeSlicing|CDISpecAgainstDriver|Health|HealthIgnoresApplicationFault|RealNVML)$$'

# helm, built from its Go module (hack/tools/helm) and cached under _cache/.
helm:
	@hack/tools/helm/build.sh

# The chart ships copies of the CRDs, the DeviceClasses and the controller's
# RBAC; chart-sync refreshes them (chart/chart_test.go fails when they drift).
chart-sync:
	cp api/scheduling/crds/*.yaml chart/tessera/crds/
	cp driver/deviceclasses/deviceclasses.yaml chart/tessera/files/deviceclasses.yaml
	cp deploy/rbac/tessera-controller.yaml chart/tessera/files/controller-rbac.yaml
	cp deploy/rbac/tessera-controller-shadow.yaml chart/tessera/files/controller-shadow-rbac.yaml

# Copies in sync, helm lint and helm template checks (the real-API-server
# check of the chart runs with the other integration tests in `test`).
chart-check:
	TESSERA_HELM=$$(hack/tools/helm/build.sh) $(GO) test -count=1 -short ./chart/

# The local demo: a real control plane, kwok nodes with tessera-node in
# fake-GPU mode, tessera-controller scheduling demo/examples, Kubeflow's
# training-operator for act 5 (see demo/README.md). Builds only the binaries
# it runs, each cached by version. KEEP=1 leaves the cluster running after
# the story (kubectl, built from its module, and the plugin print how) until
# `make demo-down`.
DEMO_FLAGS := $(if $(filter 1 yes true,$(KEEP)),--keep)
demo: build controlplane
	TESSERA_BIN_DIR=$$(hack/build-controlplane.sh) TESSERA_OPERATORS_DIR=$$(hack/build-operators.sh training-operator) \
		$(GO) run ./demo/local --tessera-bin $(BIN) $(DEMO_FLAGS)

# Stops a demo kept with KEEP=1: every process it recorded, and its folders.
demo-down:
	$(GO) run ./demo/local --down
