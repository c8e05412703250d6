# ebpf-cni build, test and demo entry points. Targets that touch the kernel
# (test, demo, bench, install) need root.

GO        ?= go
BIN       ?= bin
CNI_BIN   ?= /opt/cni/bin
CNI_CONF  ?= /etc/cni/net.d
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.Version=$(VERSION)

# Debian packages: tests and demo need ping and iproute2, and the hostPort tests
# compare iptables/nftables rulesets; generate needs clang & co.
RUNTIME_PKGS  := iproute2 iputils-ping iptables nftables
GENERATE_PKGS := clang-14 llvm-14

# The BPF compiler, pinned: the committed objects are byte for byte what this
# clang makes of bpf/ with these flags. Headers: bpf/include (vendored uapi
# and libbpf headers, bpf/include/update.sh) and clang's own, never the
# machine's /usr/include (-nostdlibinc).
CLANG_VERSION := 14
BPF2GO_CC     := clang-$(CLANG_VERSION)
BPF2GO_STRIP  := llvm-strip-$(CLANG_VERSION)
BPF2GO_CFLAGS := -nostdlibinc -Ibpf/include -Ibpf -O2 -Wall -Werror
BENCH_PKGS    := iproute2 iputils-ping iptables iperf3 time

.PHONY: helm check-chart all build generate check-generate check-tidy test unit-test race lint install demo bench bench-quick bench-cni bench-bandwidth bench-events bench-masq bench-netpol bench-packet deps deps-bench deps-generate clean bench-tunnel

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/ebpf-cni ./cmd/ebpf-agent

# Installs Debian packages only when a command is missing, so repeated runs are fast.
deps:
	@command -v ping >/dev/null && command -v ip >/dev/null && command -v iptables-save >/dev/null && \
		command -v ip6tables-save >/dev/null && command -v nft >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(RUNTIME_PKGS))

deps-generate:
	@command -v $(BPF2GO_CC) >/dev/null && command -v $(BPF2GO_STRIP) >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(GENERATE_PKGS))

deps-bench:
	@command -v iperf3 >/dev/null && command -v iptables >/dev/null && command -v ping >/dev/null && test -x /usr/bin/time || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BENCH_PKGS))

# Rebuilds the committed bpf2go output (Go files and .o objects) from bpf/.
generate: deps-generate
	@$(BPF2GO_CC) --version | grep -q 'clang version $(CLANG_VERSION)\.' || \
		(echo "make generate: want clang $(CLANG_VERSION) ($(BPF2GO_CC)); the committed objects were built with it" >&2; exit 1)
	BPF2GO_CC=$(BPF2GO_CC) BPF2GO_STRIP=$(BPF2GO_STRIP) BPF2GO_CFLAGS="$(BPF2GO_CFLAGS)" $(GO) generate .

# Fails when the committed bpf2go output differs from what bpf/ compiles to,
# or when generate wrote an output file git does not track (a new program or
# map object nobody committed).
GENERATED := ':(glob)pkg/**/*_bpfel.go' ':(glob)pkg/**/*_bpfel.o'
check-generate: generate
	@git diff --exit-code --stat -- $(GENERATED) && \
		test -z "$$(git status --porcelain --untracked-files=all -- $(GENERATED))" || \
		(git status --short --untracked-files=all -- $(GENERATED); \
		 echo "bpf2go output is stale or untracked: run 'make generate' and commit the result" >&2; exit 1)

# go.mod and go.sum as `go mod tidy` leaves them (direct dependencies not
# marked indirect).
check-tidy:
	$(GO) mod tidy -diff

# Build tags of the test files that are not built by default (benchmarks,
# the crash-injection build): vet covers them too.
TEST_TAGS := masqbench,latbench,progcost,crashpoint,review_repro,hookbench,pktbudget,tunnelbench

lint:
	@test -z "$$(gofmt -l .)" || (echo "gofmt needed on:"; gofmt -l .; exit 1)
	$(GO) vet ./...
	$(GO) vet -tags $(TEST_TAGS) ./...
	$(GO) test -count=1 -run 'TestNetlinkDumpsAreSafe|TestFunctionsAreShort|TestExportsHaveProductUsers|TestDocsCommandsNameThisLayout' .

# Unit and integration tests. Integration tests need root; as root they run
# the real plugin in network namespaces they create.
# No apt-get here: `make deps` (which .ci/run calls) installs what tests exec.
# The integration package takes about 46 minutes here (round 16's CI run: 2762 s):
# the timeout leaves room for a slower machine rather than fail a green suite.
# As a plain `go test` prints, plus the 25 slowest tests at the end (test2json
# read by test/internal/testlog): CI runs near its time budget.
test: lint
	$(GO) build -o $(BIN)/testlog ./test/internal/testlog
	bash -c 'set -o pipefail; $(GO) test -count=1 -timeout 70m -json ./... | $(BIN)/testlog'

# The paths of older kernels, on this one (docs/compat.md): the datapath,
# hostPort, masquerade, chain and upgrade tests again with every fallback
# forced (tcx: clsact + cls_bpf on host veths and uplinks; fibsrc: the
# masquerade source from the uplink's addresses; the compat build; no pacing program;
# so_netns_cookie: the node's netns cookie learned by a cgroup connect4 program).
# 2 to 9 minutes on this 2-CPU machine, as other jobs loaded it (load 4 to 30).
FALLBACK_TESTS := TestCompat|TestChain|TestHostPort|TestMasq$$|TestMasqCheck|TestDatapath|TestAttach|TestAgentRestartAndUpgradeWithoutLoss|TestUplinkRecreated|TestUplinkSecondPinDirRefused
.PHONY: test-fallback
test-fallback: deps
	EBPF_CNI_FORCE_FALLBACK=all $(GO) test -count=1 -timeout 40m -run '$(FALLBACK_TESTS)' ./test/integration/

unit-test:
	$(GO) test -count=1 ./pkg/...

# The race detector over the packages whose tests need no root (no BPF, no
# namespaces): they run anywhere, CI included.
RACE_PKGS := ./pkg/cni/... ./pkg/endpoint/... ./pkg/state/... ./pkg/maps/... ./pkg/agent/... ./pkg/policy/... ./pkg/kubewatch/... ./pkg/events/... ./deploy/...
race:
	$(GO) test -race -count=1 $(RACE_PKGS)

install: build
	install -d $(CNI_BIN) $(CNI_CONF)
	install -m 0755 $(BIN)/ebpf-cni $(CNI_BIN)/ebpf-cni
	install -m 0755 $(BIN)/ebpf-agent /usr/local/bin/ebpf-agent
	@if [ -e $(CNI_CONF)/10-ebpf-cni.conflist ]; then \
		echo "$(CNI_CONF)/10-ebpf-cni.conflist exists, not overwriting"; \
	else install -m 0644 deploy/10-ebpf-cni.conflist $(CNI_CONF)/10-ebpf-cni.conflist; fi
	@test -x $(CNI_BIN)/host-local || echo "note: $(CNI_BIN)/host-local is missing; install containernetworking/plugins"

# A node namespace, two pods through the real plugin binary, traffic, a map dump.
demo: deps
	bash test/demo.sh

# End to end under a real runtime: its own containerd + runc driven by crictl
# (test/e2e/run.sh; installs containerd and runc from apt; needs root). The
# short variant (one pod, reachable, clean removal) is the one for CI.
.PHONY: e2e e2e-short
e2e:
	bash test/e2e/run.sh

e2e-short:
	bash test/e2e/run.sh --short

# Upstream Kubernetes sig-network e2e on a real 2-node cluster on this machine
# (test/k8s: network namespaces, own containerd + kubelet + kube-proxy per
# node, nothing leaves the machine). CNI=ebpf-cni (deploy/ applied with kubectl)
# or CNI=reference (ptp + portmap + bandwidth). Builds Kubernetes v1.34 & co.
# into $(K8S_CACHE) the first time; results in results/k8s-e2e-<cni>-<time>/.
# K8S_E2E_ARGS passes more flags (e.g. -focus RE, -procs N; see -h);
# K8S_E2E_ARGS=-subnets: the nodes on two subnets behind a router that knows
# no pod CIDR, the agent tunnelling (vxlan; docs/k8s-e2e.md, issue 24).
CNI       ?= ebpf-cni
K8S_CACHE ?= /var/cache/ebpf-cni-k8s
.PHONY: k8s-e2e k8s-e2e-quick
k8s-e2e:
	EBPF_CNI_K8S_CACHE=$(K8S_CACHE) $(GO) run ./test/k8s -cni $(CNI) $(K8S_E2E_ARGS)

# HostPort, Networking Granular Checks (Pods, Services), a few Services and DNS specs.
k8s-e2e-quick:
	EBPF_CNI_K8S_CACHE=$(K8S_CACHE) $(GO) run ./test/k8s -cni $(CNI) -quick $(K8S_E2E_ARGS)

# The benchmarks, beside the reference plugins: one command with parts
# (latency, scale, hostport, throughput, memory, bandwidth; see
# go run ./test/bench -h), each part's detailed report and one combined table
# in results/bench-<date>.{md,json}: full under 15 minutes on 2 cores, quick
# about 4.
bench: deps-bench
	$(GO) run ./test/bench -attach-tc

bench-quick: deps-bench
	$(GO) run ./test/bench -attach-tc -quick

# The plugin parts only (ADD/DEL latency, at scale, hostPort, throughput, memory, burst, coldstart) ...
bench-cni: deps-bench
	$(GO) run ./test/bench -parts latency,scale,hostport,throughput,memory,burst,coldstart

# ... and bandwidth accuracy and latency under load, ebpf-cni beside ptp + bandwidth.
bench-bandwidth: deps-bench
	$(GO) run ./test/bench -parts bandwidth

# Datapath events: throughput and request/response with events off vs flow
# events on, the agent's CPU while observing a 10k/s drop flood.
bench-events: deps-bench
	$(GO) run ./test/bench -parts events

# The per-packet budget: ns per program run (BPF_PROG_TEST_RUN) on each
# path, beside 41b58f6 (-packet-ref), the two builds alternating.
bench-packet: deps-bench
	$(GO) run ./test/bench -parts packet

# NetworkPolicy: throughput and request/response with 0, 1 and 100 policies,
# new connections/s through an allowed policy, policy change to enforcement
# and memory at 1000 pods x 500 policies (compiler and writer, no API server).
bench-netpol: deps-bench
	$(GO) run ./test/bench -parts netpol

# BPF masquerade beside ptp's iptables MASQUERADE: throughput and new
# connections/s, in the two-node lab of the masquerade tests.
bench-masq: deps-bench
	$(GO) test -tags masqbench -count=1 -run TestMasqBench -v ./test/integration/

# Cross-node pod-to-pod throughput, host-gw routes vs the VXLAN tunnel, in
# the tunnel lab (docs/tunnel.md).
# NODE_CPUS=1: each node's receive and its pod's iperf3 on a CPU of its own
# (docs/performance.md, round 13).
bench-tunnel: deps-bench
	TUNNEL_BENCH_NODE_CPUS=$(NODE_CPUS) $(GO) test -tags tunnelbench -count=1 -run '^TestTunnelBench$$' -v ./test/integration/

clean:
	rm -rf $(BIN)

# The helm CLI, built from its Go module (test/helm/tools pins the version), for
# the chart's checks; nothing is downloaded but modules.
$(BIN)/helm: test/helm/tools/go.mod test/helm/tools/go.sum
	cd test/helm/tools && CGO_ENABLED=0 $(GO) build -trimpath -o $(abspath $(BIN))/helm helm.sh/helm/v3/cmd/helm
helm: $(BIN)/helm

# deploy/helm/ebpf-cni: `helm lint --strict`, and `helm template` rendering the
# objects of deploy/ebpf-cni.yaml (test/e2e/deploycheck/chart_test.go).
check-chart: $(BIN)/helm
	cd test/e2e/deploycheck && HELM=$(abspath $(BIN))/helm $(GO) test -count=1 -run 'Chart' ./...
