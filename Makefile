# vpcip — make demo (the main job on vpcsim), make test (everything, as root).
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
export GOFLAGS ?= -buildvcs=false

BINARIES := vpcipd vpcip-cni vpcipctl vpcsim

.PHONY: all build deps test-deps containerd-setup k8s-tools image demo demo-containerd demo-cluster test test-one lint bench bench-pool bench-frag soak fleet chaos clean dashboards readme-picture

all: build

# -s -w: no symbol table or DWARF (stack traces keep function names); the
# plugin is executed for every pod, and a smaller binary starts faster.
LDFLAGS := -s -w

# The plugin is linked statically (CGO_ENABLED=0): a dynamically linked Go
# binary spends ~0.5M instructions per start in the dynamic loader and libc
# before main. The others keep the default (their packages stay cached).
# Its build tags (net/http without HTTP/2, docs/design.md §3) are in
# cmd/vpcip-cni/build-tags, which every build of the plugin reads
# (test/pluginbuild checks they do).
PLUGIN_TAGS := $(shell cat cmd/vpcip-cni/build-tags)
build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags='$(LDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(filter-out vpcip-cni,$(BINARIES)))
	CGO_ENABLED=0 $(GO) build -ldflags='$(LDFLAGS)' -tags=$(PLUGIN_TAGS) -o $(BIN)/ ./cmd/vpcip-cni
	ln -f $(BIN)/vpcipctl $(BIN)/kubectl-vpcip

deps:
	@bash scripts/deps.sh

## image: vpcip's container image as an OCI archive (bin/vpcip-image.tar) for
## `ctr -n k8s.io images import`, built without Docker: static binaries plus
## Debian's iptables userland; reproducible (same inputs, same digest).
## Multi-architecture: one image index with a linux/amd64 and a linux/arm64
## manifest (binaries cross-compiled into bin/image/linux_ARCH, Debian's
## packages of that architecture); bin/image/ also holds the host's binaries.
IMAGE_VERSION ?= 0.1.0
IMAGE_NAME ?= localhost/vpcip/vpcip:$(IMAGE_VERSION)
IMAGE_ARCHES ?= amd64 arm64
IMAGE_BINARIES := vpcipd vpcip-cni vpcipctl
HOSTARCH := $(shell $(GO) env GOHOSTARCH)
image: deps
	@mkdir -p $(BIN)/image
	for arch in $(IMAGE_ARCHES); do \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags='$(LDFLAGS) -X main.version=$(IMAGE_VERSION)' \
			-o $(BIN)/image/linux_$$arch/ $(addprefix ./cmd/,$(filter-out vpcip-cni,$(IMAGE_BINARIES))) || exit 1; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags='$(LDFLAGS) -X main.version=$(IMAGE_VERSION)' -tags=$(PLUGIN_TAGS) \
			-o $(BIN)/image/linux_$$arch/ ./cmd/vpcip-cni || exit 1; \
		bash scripts/reference-plugin.sh $$arch ipam/host-local $(BIN)/image/linux_$$arch || exit 1; \
	done
	$(if $(filter $(HOSTARCH),$(IMAGE_ARCHES)),ln -f $(addprefix $(BIN)/image/linux_$(HOSTARCH)/,$(IMAGE_BINARIES)) $(BIN)/image/)
	$(GO) run ./build/mkimage -bin $(BIN)/image $(foreach arch,$(IMAGE_ARCHES),-root $(arch)="$$(bash scripts/image-root.sh $(arch) | tail -1)") \
		-o $(BIN)/vpcip-image.tar -name $(IMAGE_NAME)

# All of make test's Debian packages in one apt-get, so the builds after it
# (containerd-setup, k8s-tools) can run at once without racing for dpkg's lock.
test-deps:
	@bash scripts/deps.sh promtool valgrind qemu-user-static containerd runc etcd-server

## containerd-setup: containerd + runc (Debian), containerd 2 (module proxy), reference plugins, pause image.
containerd-setup:
	@bash scripts/containerd-setup.sh --containerd2

## k8s-tools: kube-apiserver, controller-manager, scheduler, kubelet, kubectl, helm and helm4 (module proxy, cached), etcd (Debian).
k8s-tools:
	@bash scripts/k8s-tools.sh >/dev/null

## demo-cluster: a real Kubernetes cluster on two vpcsim instances (kubelet + containerd each); vpcip installed
## with its Helm chart from `make image`, 40 pods, a full node, a rolling upgrade, uninstall; then tear down.
## IPV6=1: an IPv6 single-stack cluster (Services, nodes, pods) with vpcip's IPv6 mode: 6 pods, EC2's view, IPv6
## pings across nodes, IPv4 egress to the outside host.
demo-cluster: deps containerd-setup k8s-tools image
	$(GO) run ./test/kubecluster/demo --image $(BIN)/vpcip-image.tar --vpcipctl $(BIN)/image/vpcipctl $(if $(IPV6),--ipv6)

## demo: two m5.large nodes on vpcsim, 40 pods through the real plugin path, then tear down.
demo: deps build
	$(GO) run ./test/e2e/demo --bin $(BIN)

## demo-containerd: the same product path driven by a real containerd CRI per node.
demo-containerd: deps build containerd-setup
	$(GO) run ./test/containerd/demo --bin $(BIN)

## lint: formatting, golangci-lint (.golangci.yml; the version tools/golangci pins, built by
## scripts/golangci-lint.sh; its govet runs the analyzers `go vet` runs), and the dependency and
## shape rules of docs/design.md §3 (test/deps).
# No separate `go vet ./...`: golangci-lint v2.15's govet runs go vet's 35
# default analyzers (and inline) on the same packages and tests; vet again
# cost about 2 CPU-minutes of a cold make test.
lint:
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "gofmt needed:"; echo "$$fmt"; exit 1; fi
	$$(bash scripts/golangci-lint.sh | tail -n 1) run --allow-serial-runners ./...
	$(GO) test -count=1 ./test/deps
	cd tools/dashboards && $(GO) vet . && $(GO) run . -check -out $(CURDIR)/charts/vpcip/files/dashboards

## readme-picture: run the monitoring scenario (root) and draw docs/fleet-dashboard.png from the Fleet dashboard's query results.
readme-picture: test-deps
	@mkdir -p results
	VPCIP_PANELS_OUT=$(CURDIR)/results/panels.json $(GO) test -count=1 -run TestMonitoringScenario ./test/monitoring
	cd tools/dashboards && $(GO) run ./picture -in $(CURDIR)/results/panels.json -out $(CURDIR)/docs/fleet-dashboard.png

## dashboards: regenerate the Grafana dashboards from tools/dashboards (grafana-foundation-sdk) into the chart.
dashboards:
	cd tools/dashboards && $(GO) run . -out $(CURDIR)/charts/vpcip/files/dashboards

## test: lint, then every package's tests (netns, iptables and e2e tests need root). Checks the machine
## first (scripts/preflight.sh), times each phase and prints the times at the end (results/make-test-*).
# containerd's setup and golangci-lint's build run beside the Kubernetes
# build (a cold one leaves a core idle while modules download and its
# binaries link); the tests wait for containerd's.
PHASES := $(CURDIR)/results/make-test-phases.tsv
TESTLOG := $(CURDIR)/results/make-test.log
TESTJSON := $(CURDIR)/results/make-test.json
BESIDELOG := $(CURDIR)/results/make-test-beside.log
SETUPLOG := $(CURDIR)/results/make-test-containerd.log
GOLANGCILOG := $(CURDIR)/results/make-test-golangci.log
# make test's clusters run an image of the host's architecture alone
# (bin/test/vpcip-image.tar); the image of every architecture
# (bin/every-arch/, apart from bin/image/ which test/pluginbuild reads), lint
# and the image's test under qemu run beside the tests at the lowest priority,
# on the processor time the tests leave idle (waiting for pods, grace periods).
TESTBIN := $(BIN)/test
PHASE = VPCIP_PHASES=$(PHASES) bash scripts/phase.sh
# One build configuration for the probe, the image, vet, the test binaries
# and the binaries tests build: the image's (static, -trimpath). Each
# configuration compiles the whole dependency tree again (the AWS SDK's ec2
# package alone takes minutes cold), so mixing them cost a cold run minutes.
ONEBUILD = CGO_ENABLED=0 GOFLAGS="$(GOFLAGS) -trimpath"
# The packages whose tests take minutes, started first (two run at once; a
# third beside them on two cores made the end-to-end package 160 s slower
# and a 30 s wait in it time out). results/make-test.log has each time.
SLOWFIRST := ./test/e2e ./test/kubecluster ./test/containerd ./test/fleet ./ipamd/cluster ./test/cnitest ./test/monitoring
# What the tests are told of the machine: where Kubernetes' binaries and the
# test image are, and that containerd, Kubernetes, valgrind and qemu must be
# there (a test that needs one fails rather than skips).
TESTENV = VPCIP_K8S_BIN=$$(bash scripts/k8s-tools.sh | tail -n 1) VPCIP_REQUIRE_CONTAINERD=1 VPCIP_REQUIRE_CONTAINERD2=1 VPCIP_REQUIRE_KUBE=1 \
	VPCIP_REQUIRE_VALGRIND=1 VPCIP_REQUIRE_QEMU=1 VPCIP_IMAGE=$(TESTBIN)/vpcip-image.tar VPCIP_VPCIPCTL=$(TESTBIN)/image/vpcipctl
test:
	@mkdir -p results && : >$(PHASES)
	@$(PHASE) "tools (Debian packages)" $(MAKE) --no-print-directory test-deps
	@$(ONEBUILD) $(PHASE) preflight bash scripts/preflight.sh
	@set -o pipefail; export CGO_ENABLED=0 GOFLAGS="$(GOFLAGS) -trimpath"; \
	( $(PHASE) "beside: containerd, plugins, pause" $(MAKE) --no-print-directory containerd-setup ) >$(SETUPLOG) 2>&1 & setup=$$!; \
	( $(PHASE) "beside: golangci-lint build" nice -n 19 bash scripts/golangci-lint.sh ) >$(GOLANGCILOG) 2>&1 & golangci=$$!; \
	$(PHASE) "kubernetes, helm, etcd" $(MAKE) --no-print-directory k8s-tools && \
	$(PHASE) "image ($(HOSTARCH), for the test clusters)" $(MAKE) --no-print-directory image BIN=$(TESTBIN) IMAGE_ARCHES=$(HOSTARCH) && \
	$(PHASE) "compile every package and its tests" sh -c 'bash scripts/gotestsum.sh >/dev/null && $(GO) list -test -export -deps ./... >/dev/null'; \
	rc=$$?; w0=$$(date +%s.%N); wait $$setup; src=$$?; \
	awk -v s=$$w0 -v e=$$(date +%s.%N) -v rc=$$src 'BEGIN{printf "before the tests, waiting for the containerd setup\t%.1f\t%d\n", e-s, rc}' >>$(PHASES); \
	if [ $$src -ne 0 ]; then echo "make test: FAILED setting up containerd ($(SETUPLOG)):"; tail -n 60 $(SETUPLOG); fi; \
	if [ $$rc -ne 0 ] || [ $$src -ne 0 ]; then wait $$golangci; exit 1; fi; \
	( $(PHASE) "beside: lint" nice -n 19 $(MAKE) --no-print-directory lint && \
	  $(PHASE) "beside: image, every architecture" nice -n 19 $(MAKE) --no-print-directory image BIN=$(BIN)/every-arch && \
	  VPCIP_REQUIRE_QEMU=1 VPCIP_IMAGE=$(BIN)/every-arch/vpcip-image.tar $(PHASE) "beside: image test, every architecture" \
		nice -n 19 $(GO) test -count=1 -run '^TestImageArchiveRunsOnEachArchitecture$$' ./build/mkimage ) >$(BESIDELOG) 2>&1 & beside=$$!; \
	$(TESTENV) $(PHASE) tests \
		bash scripts/run-tests.sh $(TESTJSON) -count=1 -timeout 25m -skip '^TestImageArchiveRunsOnEachArchitecture$$' $(SLOWFIRST) ./... 2>&1 | tee $(TESTLOG); \
	rc=$$?; echo "make test: waiting for what runs beside the tests (lint, the image for every architecture; $(BESIDELOG))"; \
	w0=$$(date +%s.%N); wait $$beside; brc=$$?; \
	awk -v s=$$w0 -v e=$$(date +%s.%N) -v rc=$$brc 'BEGIN{printf "after the tests, waiting for the beside phases\t%.1f\t%d\n", e-s, rc}' >>$(PHASES); \
	if [ $$brc -ne 0 ]; then echo "make test: FAILED beside the tests (lint or the image):"; tail -n 60 $(BESIDELOG); fi; \
	bash scripts/test-report.sh $(PHASES) $(TESTJSON); [ $$rc -eq 0 ] && [ $$brc -eq 0 ]

## test-one: one test as make test runs it (its environment, -count=1, verbose), once make test has built what it
## needs (or builds it): make test-one RUN=TestClusterLeadTime PKG=./test/kubecluster. RUN is a test name, or
## TestName/SubtestName (each part a regular expression, anchored), PKG a package path; it fails when no test matches.
## TestImageArchiveRunsOnEachArchitecture is the exception: it needs the every-architecture image (make image).
test-one:
	@if [ -z "$(RUN)" ] || [ -z "$(PKG)" ]; then echo "usage: make test-one RUN=TestName PKG=./path/to/package" >&2; exit 2; fi
	@$(MAKE) --no-print-directory test-deps containerd-setup k8s-tools >/dev/null
	@$(ONEBUILD) $(MAKE) --no-print-directory image BIN=$(TESTBIN) IMAGE_ARCHES=$(HOSTARCH) >/dev/null
	@out=$$(mktemp); run=$$(printf '%s' '$(RUN)' | sed 's#[^/][^/]*#^(&)$$#g'); set -o pipefail; \
	$(ONEBUILD) $(TESTENV) $(GO) test -count=1 -timeout 25m -run "$$run" -v $(PKG) 2>&1 | tee $$out; rc=$$?; \
	if [ $$rc -eq 0 ] && ! grep -q '^--- PASS' $$out; then echo "make test-one: no test in $(PKG) matches $(RUN) (or it was skipped)" >&2; rc=1; fi; \
	rm -f $$out; exit $$rc

## soak: the kill campaign with 100 kill -9 of vpcipd during churn on two vpcsim nodes (make test runs 6).
soak: deps
	VPCIP_KILLS=100 $(GO) test -count=1 -timeout 60m -run '^TestKillCampaign$$' -v ./test/e2e/

## fleet: 200 vpcipd against one vpcsim with EC2's account-level request buckets and one real kube-apiserver,
## once per model of sharing the account's EC2 budget (per-node backoff, the coordinated budget, a central operator's
## rate limit: every mutating EC2 request in one queue at Cilium's operator defaults, 4/s, burst 20), each on a fresh fleet:
## (a) the node group launched at once, 20 pods per node within a minute, (b) a rollout in 4 waves, (c) churn,
## (d) scale-in; prints each table and the models side by side. About 36 minutes for the three here (11, 11 and 15).
## `make test` runs a short variant (6 nodes per model). FLEET_NODES=n changes the fleet's size,
## FLEET_SCENARIOS=a (letters of abcd) and FLEET_MODELS=fleet (node,fleet,operator) pick a part.
FLEET_NODES ?= 200
FLEET_SCENARIOS ?= abcd
FLEET_MODELS ?= node,fleet,operator
# The coordinated budget's share of each account bucket: all of it, as per-node backoff and the operator draw on
# all of it (vpcsim's account has no other caller); the daemon's own default is 80.
FLEET_BUDGET_SHARE ?= 100
fleet: deps k8s-tools
	VPCIP_K8S_BIN=$$(bash scripts/k8s-tools.sh | tail -n 1) VPCIP_FLEET_NODES=$(FLEET_NODES) VPCIP_FLEET_PODS=20 VPCIP_FLEET_SPREAD=60s \
	VPCIP_FLEET_CHURN=3m VPCIP_FLEET_CHURN_INTERVAL=10s VPCIP_FLEET_SETTLE=15s VPCIP_FLEET_SCALEIN_SETTLE=90s VPCIP_FLEET_WAVES=4 \
	VPCIP_FLEET_SCENARIOS=$(FLEET_SCENARIOS) VPCIP_FLEET_MODELS=$(FLEET_MODELS) VPCIP_FLEET_BUDGET_SHARE=$(FLEET_BUDGET_SHARE) \
	$(ONEBUILD) $(GO) test -count=1 -timeout 120m -run '^TestFleet$$' -v ./test/fleet/

## chaos: the fault campaign on the real cluster (test/kubecluster TestChaosCampaign; make test runs a short one):
## the chart's DaemonSet, pods churning through kubelet, CHAOS_FAULTS faults (default 100) at random moments;
## CHAOS_SEED replays a campaign's plan (default: the time). A second image with another version string
## (bin/chaos/vpcip-image.tar) is what `helm upgrade` goes to before `helm rollback`.
## Prints the seed, fault and check counts, the longest violation and the daemons' API requests.
CHAOS_FAULTS ?= 100
CHAOS_SEED ?=
chaos: deps containerd-setup k8s-tools image
	@$(ONEBUILD) $(MAKE) --no-print-directory image BIN=$(BIN)/chaos IMAGE_VERSION=$(IMAGE_VERSION)-chaos >/dev/null
	VPCIP_CHAOS_FAULTS=$(CHAOS_FAULTS) VPCIP_CHAOS_SEED=$(CHAOS_SEED) VPCIP_CHAOS_UPGRADE_IMAGE=$(BIN)/chaos/vpcip-image.tar \
	VPCIP_K8S_BIN=$$(bash scripts/k8s-tools.sh | tail -n 1) VPCIP_REQUIRE_KUBE=1 VPCIP_REQUIRE_CONTAINERD2=1 \
	VPCIP_IMAGE=$(BIN)/vpcip-image.tar VPCIP_VPCIPCTL=$(BIN)/image/vpcipctl $(ONEBUILD) $(GO) test -count=1 -timeout 12h -run '^TestChaosCampaign$$' -v ./test/kubecluster/

## bench: plugin latency, CPU time and instructions vs the reference chain, burst latency, daemon RSS, EC2 calls per 100 pods.
## BENCH_FLAGS go to test/bench (say, --cachegrind-plugin NAME=PATH to count another plugin binary's instructions in the same run).
bench: deps build containerd-setup
	@bash scripts/deps.sh valgrind
	$(GO) run ./test/bench --bin $(BIN) --out $(CURDIR)/results $(BENCH_FLAGS)
	$(GO) test -run '^$$' -bench RunPodSandbox -benchtime 3x ./test/containerd/
	$(MAKE) bench-pool

## bench-frag: /28 fragmentation of one subnet shared by churning secondary-IP and prefix-mode nodes, with and without the /28-aware choice of single addresses and the prefix fallback's conversion back to /28s (vpcsim, virtual clock; FRAG_HOURS simulated hours).
FRAG_HOURS ?= 4
bench-frag:
	$(GO) test -count=1 -run 'TestFragmentationScenario$$' -v ./ipamd/pool/ -frag.hours=$(FRAG_HOURS)

## bench-pool: warm-pool policies side by side on churn traces (virtual clock, in-memory EC2): idle address-hours, waits, EC2 calls.
bench-pool:
	$(GO) run ./test/poolsim/benchpool

clean:
	rm -rf $(BIN)
