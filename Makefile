# vipd: build, test, demo, bench and packages.
#
#   make demo   a self-contained network-namespace lab: VIP held, failover
#   make test   every test (installs what it needs; needs root)
#
# Targets that need root re-run themselves through sudo when you are not
# root, and stop with a clear message when there is no sudo.

SHELL       := /bin/bash
GO          ?= go
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT      ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# The binaries carry the package version (1.2.3+git4.abc1234, not the raw
# git describe), so `vipd manifest static-pod` names the tag `make image` makes.
BIN_VERSION := $(shell packaging/build.sh --print-version "$(VERSION)" 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(BIN_VERSION) -X main.commit=$(COMMIT)
BIN         := bin/vipd
CTRL_BIN    := bin/vipd-controllers
CACHE       := .cache
APT_PKGS    := frr etcd-server iproute2 tcpdump arping ndisc6 nftables iputils-ping curl \
               debootstrap systemd-container rpm runc
# BIRD 2: the second router of the bgp interop tests (test/bgp).
APT_PKGS    += bird2
# iptables (nft backend): the egress lab installs a CNI-style masquerade rule (test/egress).
APT_PKGS    += iptables
# keepalived: the reference of make bench; stress-ng: load for the fast
# profile's false-failover checks (make bench, test/fast).
APT_PKGS    += keepalived stress-ng
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.6.1
GOTEST      := $(GO) test -count=1
# Integration packages run one at a time: they measure timings in network
# namespaces and must not fight each other for the two cores of CI.
INTEGRATION := ./test/... ./bfd/... ./lab/... ./controllers/kube/...

export CGO_ENABLED ?= 0
export GOFLAGS ?= -mod=mod

ROOT_TARGETS := test test-integration demo bench deps test-packaging
ifneq ($(shell id -u),0)
ifneq ($(filter $(ROOT_TARGETS),$(MAKECMDGOALS)),)
SUDO := $(shell command -v sudo 2>/dev/null)
$(MAKECMDGOALS):
ifeq ($(SUDO),)
	@echo "make $@ needs root (network namespaces, raw sockets, apt-get) and sudo is not installed: run it as root." >&2; exit 1
else
	$(SUDO) -E env "PATH=$$PATH" $(MAKE) $(MAKECMDGOALS)
endif
.PHONY: $(MAKECMDGOALS)
endif
endif

ifeq ($(shell id -u),0)

.PHONY: all build test test-unit test-integration lint demo bench deps go-deps kube-apiserver helm k8s-binaries release-artifacts package test-packaging clean simulate image promtool

all: build

build: $(BIN) $(CTRL_BIN)

GO_SOURCES := $(shell find . -name '*.go' -not -path './.cache/*' 2>/dev/null) go.mod go.sum

# vipd's runtime defaults (packaging/build.sh --print-godebug): its
# goroutines' stacks are not shrunk by the garbage collector, see
# cmd/vipd/lean.go. Evaluated only when bin/vipd is built.
VIPD_GODEBUG = $(shell packaging/build.sh --print-godebug)

$(BIN): $(GO_SOURCES)
	@mkdir -p bin
	$(GO) build -trimpath -ldflags '$(LDFLAGS) -X runtime.godebugDefault=$(VIPD_GODEBUG)' -o $(BIN) ./cmd/vipd

# The Kubernetes controllers are a separate binary that vipd starts when
# VIPD_CONTROLLERS is set: client-go would double vipd's resident memory.
$(CTRL_BIN): $(GO_SOURCES)
	@mkdir -p bin
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(CTRL_BIN) ./cmd/vipd-controllers

## deps: the Debian packages and Go modules the tests use
deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@$(MAKE) --no-print-directory go-deps promtool

go-deps:
	$(GO) mod download
	$(GO) mod download -json sigs.k8s.io/cluster-api@$(CAPI_VERSION) >/dev/null
	$(GO) mod download -json github.com/prometheus-operator/prometheus-operator@$(PROMETHEUS_OPERATOR_VERSION) >/dev/null

# Cluster API release whose own IPAM CRDs the ipam tests install (read from
# the module cache; keep in step with CAPIVersion in controllers/ipam/harness_test.go).
CAPI_VERSION := v1.10.4

# prometheus-operator release whose ServiceMonitor, PodMonitor and PrometheusRule CRDs
# test/helm serves (read from the module cache; keep in step with
# PrometheusOperatorVersion in test/helm/install_test.go).
PROMETHEUS_OPERATOR_VERSION := v0.85.0

# kube-apiserver (test/kube, kube/, ipam/, ...) and helm (test/helm, make
# release-artifacts), built from the Go module proxy into .cache/ and then
# reused. hack/k8s-binaries.sh builds what is missing of them in one
# throwaway module with one go build, so the k8s.io packages both use compile
# once and the two links overlap (cold: 474 s of CPU instead of 526 s built
# one after the other; 8-10 minutes on 2 busy cores). Keep KUBE_VERSION in
# step with KubeVersion in internal/kubetest and HELM_VERSION with
# HelmVersion in test/helm/chart_test.go (test/helm checks both).
KUBE_VERSION := v1.34.4
HELM_VERSION := v3.19.5
K8S_BINARIES := KUBE_VERSION=$(KUBE_VERSION) HELM_VERSION=$(HELM_VERSION) nice -n 5 hack/k8s-binaries.sh
helm:
	$(K8S_BINARIES) helm

kube-apiserver:
	$(K8S_BINARIES) kube-apiserver

k8s-binaries:
	$(K8S_BINARIES) kube-apiserver helm

# release-artifacts: vipd's Cluster API IPAM provider as a clusterctl local
# repository, out/clusterctl/ipam-vipd/<version>/{ipam-components.yaml,metadata.yaml},
# rendered from the Helm chart (docs/pools.md: clusterctl init --ipam vipd).
PROVIDER_VERSION ?= $(shell git describe --tags --abbrev=0 --match 'v[0-9]*.[0-9]*.[0-9]*' 2>/dev/null || echo v0.1.0)
release-artifacts: helm
	$(GO) run ./hack/ipam-components -helm $(CACHE)/helm-$(HELM_VERSION) -chart deploy/helm/vipd \
		-version $(PROVIDER_VERSION) -out out/clusterctl

# promtool alone, from Debian's prometheus package: installing the package
# would also start a Prometheus server. Tests find it in .cache/ (or on PATH).
PROMTOOL := $(CACHE)/promtool/promtool
promtool: $(PROMTOOL)
$(PROMTOOL):
	@mkdir -p $(CACHE)/promtool
	cd $(CACHE)/promtool && rm -rf x *.deb && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }; } && \
		dpkg-deb -x prometheus_*.deb x && mv x/usr/bin/promtool promtool && rm -rf x *.deb
	@$(PROMTOOL) --version | head -1

## test: every test, unit and integration (root)
test: deps build k8s-binaries lint
	@# The integration packages run even when a unit test failed (one
	@# flaky unit test must not hide them); make test fails if either did.
	rc=0; \
	$(GOTEST) -timeout 20m $$($(GO) list ./... | grep -v -E '/test/|/bfd$$|/lab$$|/kube$$') || rc=$$?; \
	VIPD_TEST_BINARY=$(CURDIR)/$(BIN) $(GOTEST) -p 1 -timeout 25m $(INTEGRATION) || rc=$$?; \
	exit $$rc

test-unit:
	$(GOTEST) -short ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

## simulate: the strict simulator of the consensus lease machine over 2,000 schedules per profile (make test runs 20 of each)
simulate:
	$(GO) run ./cluster/lease/sim/cmd/vipd-sim -seeds $${LEASE_SEEDS:-2000}

## demo: a 3-node network-namespace lab showing the VIP and a failover
demo: deps build
	VIPD_TEST_BINARY=$(CURDIR)/$(BIN) $(GO) run ./lab/cmd/vipd-lab demo

## bench: failover benchmarks in the lab; prints tables, writes out/bench.json
# side by side with keepalived (default and VRRPv3 fast), idle cost per node,
# and a 10-minute false-failover run under stress-ng (VIPD_BENCH_STRESS=1m
# shortens it for a quick check).
bench: deps build kube-apiserver
	@mkdir -p out
	VIPD_TEST_BINARY=$(CURDIR)/$(BIN) $(GO) run ./lab/cmd/vipd-lab bench -out out
	VIPD_TEST_BINARY=$(CURDIR)/$(BIN) VIPD_BENCH_BGP_JSON=$(CURDIR)/out/bench-bgp.json VIPD_BENCH_RUNS=5 $(GOTEST) -timeout 20m -run '^TestBenchBGP$$' -v ./test/bgp/
	VIPD_TEST_BINARY=$(CURDIR)/$(BIN) VIPD_BENCH_POOLS=1 VIPD_BENCH_POOLS_JSON=$(CURDIR)/out/bench-pools.json $(GOTEST) -timeout 15m -run '^TestBenchPools$$' -v ./test/pools/

package:
	packaging/build.sh $(VERSION)

## image: the container image, an OCI archive in dist/ (no Docker daemon)
image:
	packaging/image.sh $(VERSION)

test-packaging: deps build
	VIPD_TEST_BINARY=$(CURDIR)/$(BIN) $(GOTEST) -timeout 20m ./test/packaging/

clean:
	rm -rf bin dist out

endif
