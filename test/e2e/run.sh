#!/usr/bin/env bash
# ebpf-cni end to end under a real container runtime: containerd (CRI) + runc,
# driven with crictl the way the kubelet drives them.
#
#   test/e2e/run.sh           full run (make e2e): two pods, the DaemonSet's
#                             install and agent containers, traffic, hostPort and
#                             bandwidth checks when the plugin has them
#   test/e2e/run.sh --short   the minimum that proves the plugin under containerd
#                             (make e2e-short, for CI): one pod, reachable, clean removal
#
# It installs containerd, runc (and iproute2, curl, ping) from apt when missing,
# builds crictl v1.26.1 through the Go module proxy (cached under
# ~/.cache/ebpf-cni-e2e), builds the plugin, host-local, loopback and two images
# (a pause and an HTTP server) written as OCI archives by hand
# (test/e2e/images/mkimage) and imported with `ctr images import`: no registry.
#
# Isolation: its own containerd (own root, state, socket and config under a
# temporary directory) runs in a private mount namespace in which /run and
# /var/lib are overlays whose writes land in the temporary directory, so
# nothing is written to the host's /run/containerd, /var/lib/containerd,
# /var/lib/cni, /etc/cni or /opt/cni, and an already running containerd is
# never touched. Its own bpffs pin directory (/sys/fs/bpf/ebpfe2e-<id>),
# plugin state and host-local data directory, pod subnets chosen at random,
# and a cgroup parent of its own. An EXIT trap removes everything, also on
# failure or Ctrl-C. Last line: "e2e: N passed, M failed[, K skipped]"; the exit
# status is non-zero when anything failed.
#
# The plugin's capabilities are probed before the run: an ADD with
# runtimeConfig.portMappings (or .bandwidth) against a scratch netns. A
# capability the conflist declares (deploy/: the ConfigMap, else
# 10-ebpf-cni.conflist) that the plugin rejects fails each of its checks
# with the plugin's message: a regression never passes as a skip. Override:
# EBPF_E2E_HOSTPORT=0|1, EBPF_E2E_BANDWIDTH=0|1 (unset = detect; 0 skips
# those checks, as asked). EBPF_E2E_KEEP=1 keeps the
# temporary directory (logs, configs) for inspection; everything else is still
# cleaned.
set -uo pipefail

MODE=full
for a in "$@"; do
	case $a in
	--short) MODE=short ;;
	-h | --help) sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//; $d'; exit 0 ;;
	*) echo "usage: $0 [--short]" >&2; exit 2 ;;
	esac
done

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
START=$(date +%s)
[ "$(id -u)" = 0 ] || { echo "e2e: run as root (containerd, network namespaces, BPF)" >&2; echo "e2e: 0 passed, 1 failed"; exit 1; }

CRICTL_VERSION=v1.26.1
ID=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')   # 6 hex digits
OCT=$((0x${ID:0:2} % 200 + 20))                      # pod subnets: 10.199.OCT.0/24, fd00:199:OCT::/64
WORK=$(mktemp -d /tmp/ebpf-e2e.XXXXXX)
PIN=/sys/fs/bpf/ebpfe2e-$ID
NET=ebpfe2e-$ID
CGPARENT=ebpfe2e-$ID
SOCK=$WORK/containerd.sock
BIN=$WORK/bin                  # binaries built for the run
CNI_BIN=$WORK/node/opt/cni/bin # the "node's" CNI dirs containerd is pointed at
CNI_CONF=$WORK/node/etc/cni/net.d
STATE=$WORK/cni-state
IPAMDIR=$WORK/ipam
SUBNET4=10.199.$OCT.0/24
SUBNET6=fd00:199:$OCT::/64
IMG_PAUSE=localhost/ebpf-e2e/pause:e2e
IMG_HTTPD=localhost/ebpf-e2e/httpd:e2e
IMG_CNI=localhost/ebpf-e2e/ebpf-cni:e2e
HP_A=$((30000 + 0x${ID:2:4} % 15000)) # hostPorts of pod A and B
HP_B=$((HP_A + 1))
HP_PROBE=$((HP_A + 2))
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-cni-e2e

PASS=0 FAIL=0 SKIP=0
FAILED=()
CTRD_PID='' CLIENT_PID=''
SANDBOXES=()   # every pod sandbox id ever created (for leak checks and fallback cleanup)
SCRATCH_PIDS=()
MOUNTED_BPFFS=
PORTMAP_CHAINS_OURS=

# ---------------------------------------------------------------- reporting

if [ -t 1 ]; then B=$'\033[1m' G=$'\033[32m' R=$'\033[31m' Y=$'\033[33m' N=$'\033[0m'; else B='' G='' R='' Y='' N=''; fi
bold() { printf '%s%s%s\n' "$B" "$*" "$N"; }
say() { echo; bold "== $* [$(($(date +%s) - START))s]"; }
info() { echo "   $*"; }
pass() { PASS=$((PASS + 1)); printf '  %sPASS%s %s\n' "$G" "$N" "$1"; }
fail() {
	FAIL=$((FAIL + 1)); FAILED+=("$1")
	printf '  %sFAIL%s %s\n' "$R" "$N" "$1"
	[ -n "${2:-}" ] && printf '%s\n' "$2" | tail -n 15 | sed 's/^/       | /'
	return 0
}
skip() { SKIP=$((SKIP + 1)); printf '  %sSKIP%s %s: %s\n' "$Y" "$N" "$1" "$2"; }

# check NAME CMD...: runs CMD; passes on exit 0, else fails showing its output.
check() {
	local name=$1; shift
	local out
	if out=$("$@" 2>&1); then
		pass "$name"
		[ -n "${VERBOSE:-}" ] && [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/       | /'
		return 0
	fi
	fail "$name" "$out"
	return 1
}

# fatal: a setup step failed, the rest cannot run. Counted as a failure.
fatal() {
	fail "$1" "${2:-}"
	echo "   setup failed: stopping here" >&2
	exit 1
}

# ---------------------------------------------------------------- cleanup

summary() {
	local s="e2e: $PASS passed, $FAIL failed"
	[ "$SKIP" -gt 0 ] && s+=", $SKIP skipped"
	echo
	[ "$FAIL" -gt 0 ] && printf '   failed: %s\n' "${FAILED[@]}"
	echo "   ($MODE mode, $(($(date +%s) - START))s)"
	echo "$s"
}

cri() { "$BIN/crictl" --config "$WORK/crictl.yaml" "$@"; }
ctr_() { ctr --address "$SOCK" -n k8s.io "$@"; }

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# pids_of_cgroup_parent: every process in our cgroup parent, in any hierarchy.
pids_of_cgroup_parent() {
	find /sys/fs/cgroup -maxdepth 3 -type d -name "$CGPARENT" 2>/dev/null | while read -r d; do
		find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
	done | sort -u
}

# leftovers: what the cleanup failed to remove (after the run).
leftovers() {
	local bad=0 p
	[ -e "$PIN" ] && { echo "pin dir $PIN"; bad=1; }
	alive "$CTRD_PID" && { echo "containerd $CTRD_PID"; bad=1; }
	for p in /proc/[0-9]*; do
		grep -qF -- "$WORK" "$p/cmdline" 2>/dev/null && { echo "process ${p#/proc/}: $(tr '\0' ' ' <"$p/cmdline")"; bad=1; }
	done
	[ -n "$(find /sys/fs/cgroup -maxdepth 3 -type d -name "$CGPARENT" 2>/dev/null)" ] && { echo "cgroup $CGPARENT"; bad=1; }
	ip link show "e2eup$ID" >/dev/null 2>&1 && { echo "link e2eup$ID"; bad=1; }
	grep -qF " $WORK" /proc/self/mountinfo && { echo "mounts under $WORK"; bad=1; }
	[ -z "${EBPF_E2E_KEEP:-}" ] && [ -e "$WORK" ] && { echo "$WORK"; bad=1; }
	return $bad
}

cleanup() {
	local rc=$?
	set +e
	trap - EXIT INT TERM
	say "cleanup"
	if alive "$CTRD_PID" && [ -S "$SOCK" ]; then
		for p in $(cri pods -q 2>/dev/null); do
			timeout 30 "$BIN/crictl" --config "$WORK/crictl.yaml" stopp "$p" >/dev/null 2>&1
			timeout 30 "$BIN/crictl" --config "$WORK/crictl.yaml" rmp -f "$p" >/dev/null 2>&1
		done
	fi
	if [ "$FAIL" -gt 0 ] && [ -f "$WORK/containerd.log" ]; then
		info "last errors in the containerd log ($WORK/containerd.log):"
		grep -E 'level=(error|fatal)' "$WORK/containerd.log" | grep -v 'no network config found' |
			tail -n 8 | cut -c1-400 | sed 's/^/       | /'
	fi
	if alive "$CTRD_PID"; then
		kill "$CTRD_PID"
		for _ in $(seq 50); do alive "$CTRD_PID" || break; sleep 0.1; done
		alive "$CTRD_PID" && kill -9 "$CTRD_PID"
	fi
	# Shims of our containerd (their command line names our socket), then
	# anything left in our cgroups (containers whose shim died).
	for p in /proc/[0-9]*; do
		grep -qF -- "$SOCK" "$p/cmdline" 2>/dev/null && kill -9 "${p#/proc/}" 2>/dev/null
	done
	for _ in 1 2 3; do
		local left; left=$(pids_of_cgroup_parent)
		[ -z "$left" ] && break
		kill -9 $left 2>/dev/null; sleep 0.2
	done
	for p in "$CLIENT_PID" "${SCRATCH_PIDS[@]}"; do alive "$p" && kill -9 "$p"; done
	ip link del "e2eup$ID" 2>/dev/null
	# Host veths of our pods are gone with their netns; delete any straggler.
	for s in "${SANDBOXES[@]}"; do
		[ -n "$(hostif "$s")" ] && ip link del "$(hostif "$s")" 2>/dev/null
	done
	find /sys/fs/cgroup -maxdepth 3 -depth -type d -name "$CGPARENT" 2>/dev/null | while read -r d; do
		find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	rm -rf "$PIN"
	if [ -n "$PORTMAP_CHAINS_OURS" ]; then
		for ipt in iptables ip6tables; do
			$ipt -t nat -D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
			$ipt -t nat -D OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
			$ipt -t nat -D POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
			for c in CNI-HOSTPORT-DNAT CNI-HOSTPORT-MASQ CNI-HOSTPORT-SETMARK; do $ipt -t nat -F $c; $ipt -t nat -X $c; done
		done 2>/dev/null
	fi
	[ -n "$MOUNTED_BPFFS" ] && umount /sys/fs/bpf
	# Nothing of ours is mounted in the host namespace, but be certain.
	grep -F " $WORK" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do umount -l "$m"; done
	if [ -n "${EBPF_E2E_KEEP:-}" ]; then
		info "kept $WORK (EBPF_E2E_KEEP)"
	else
		[ "$FAIL" -gt 0 ] && info "logs and configs are removed; EBPF_E2E_KEEP=1 keeps them"
		rm -rf "$WORK"
	fi
	[ $rc -ne 0 ] && [ "$FAIL" -eq 0 ] && fail "script exited with status $rc"
	check "cleanup left nothing (pins, processes, cgroups, links, mounts, temp dir)" leftovers
	summary
	[ "$FAIL" -eq 0 ] && exit 0
	exit 1
}
trap cleanup EXIT
trap 'echo; echo "interrupted"; FAIL=$((FAIL + 1)); FAILED+=("interrupted"); exit 130' INT TERM

# hostif SANDBOX: the host veth of the sandbox's eth0, as the plugin's state
# record named it when the sandbox was created (remembered by run_pod: the
# record goes with the pod, the leak checks need the name after). The plugin
# names veths; the script never re-derives the name.
declare -A HOSTIFS=()
hostif() { echo "${HOSTIFS[$1]:-}"; }
# record_hostif SANDBOX: the host veth the plugin's record names, read with
# `ebpf-agent dump attachments` (the one parser of records).
record_hostif() {
	"$BIN/ebpf-agent" dump attachments --state-dir "$STATE" -o json |
		jq -r --arg id "$1" '.[] | select(.containerID == $id and .ifname == "eth0") | .hostIf'
}

# ---------------------------------------------------------------- tools

say "dependencies"
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
command -v ip >/dev/null || need+=(iproute2)
command -v ping >/dev/null || need+=(iputils-ping)
command -v curl >/dev/null || need+=(curl)
command -v jq >/dev/null || need+=(jq)
command -v nsenter >/dev/null && command -v unshare >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
	info "apt-get install ${need[*]}"
	out=$( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") 2>&1) ||
		fatal "install ${need[*]} from apt" "$out"
fi
command -v go >/dev/null || fatal "Go toolchain" "go is not in PATH (see go.mod for the version)"
info "$(containerd --version | cut -d' ' -f1,3), $(runc --version | head -1), $(go version | cut -d' ' -f3)"

# crictl: v1.26.1's module path is github.com/kubernetes-sigs/cri-tools (the
# proxy refuses sigs.k8s.io/cri-tools). `go install ...@v1.26.1` cannot build
# it: the proxy refuses the module's version list, which go install reads,
# and go install ignores the replace directives its go.mod depends on. So
# build it as the main module from a copy of the downloaded source, where
# those replace directives apply; one of them (kubectl's staging path) is not
# on the proxy and is pointed at the published k8s.io/kubectl v0.26.0.
build_crictl() {
	local dir src
	dir=$(GOFLAGS=-mod=mod go mod download -json "github.com/kubernetes-sigs/cri-tools@$CRICTL_VERSION" | jq -r .Dir) || return 1
	[ -d "$dir" ] || { echo "go mod download gave no directory"; return 1; }
	src=$WORK/cri-tools
	cp -r "$dir" "$src" && chmod -R u+w "$src" && rm -rf "$src/vendor" || return 1
	(cd "$src" &&
		go mod edit -replace k8s.io/kubectl=k8s.io/kubectl@v0.26.0 &&
		CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
			-ldflags "-X github.com/kubernetes-sigs/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
			-o "$CACHE/crictl-$CRICTL_VERSION.tmp" ./cmd/crictl) || return 1
	mv "$CACHE/crictl-$CRICTL_VERSION.tmp" "$CACHE/crictl-$CRICTL_VERSION"
}

say "build: ebpf-cni, ebpf-agent, install-cni, host-local, loopback, crictl, images"
mkdir -p "$BIN" "$CACHE" "$WORK/images" "$CNI_BIN" "$CNI_CONF" "$STATE" "$IPAMDIR" "$WORK/logs"
cd "$ROOT" || exit 1
out=$(CGO_ENABLED=0 go build -trimpath -o "$BIN/" ./cmd/ebpf-cni ./cmd/ebpf-agent ./deploy/install-cni \
	github.com/containernetworking/plugins/plugins/ipam/host-local \
	github.com/containernetworking/plugins/plugins/main/loopback \
	./test/e2e/images/pause ./test/e2e/images/httpd ./test/e2e/images/mkimage 2>&1) ||
	fatal "go build (plugin, agent, installer, host-local, loopback, images)" "$out"
if [ ! -x "$CACHE/crictl-$CRICTL_VERSION" ]; then
	info "building crictl $CRICTL_VERSION through the Go proxy (first run only, ~1-2 min)"
	out=$(build_crictl 2>&1) || fatal "build crictl $CRICTL_VERSION" "$out"
fi
cp "$CACHE/crictl-$CRICTL_VERSION" "$BIN/crictl"

mkimage() { "$BIN/mkimage" "$@"; }
out=$( {
	mkimage -o "$WORK/images/pause.tar" -name "$IMG_PAUSE" -file "/pause=$BIN/pause" -entrypoint /pause &&
		mkimage -o "$WORK/images/httpd.tar" -name "$IMG_HTTPD" -file "/httpd=$BIN/httpd" -entrypoint /httpd -env PORT=8080 &&
		mkimage -o "$WORK/images/ebpf-cni.tar" -name "$IMG_CNI" \
			-file "/usr/local/bin/ebpf-agent=$BIN/ebpf-agent" \
			-file "/usr/local/bin/install-cni=$BIN/install-cni" \
			-file "/opt/ebpf-cni/cni-bin/ebpf-cni=$BIN/ebpf-cni" \
			-file "/opt/ebpf-cni/cni-bin/host-local=$BIN/host-local" \
			-file "/opt/ebpf-cni/cni-bin/loopback=$BIN/loopback" \
			-entrypoint /usr/local/bin/ebpf-agent
} 2>&1) || fatal "write OCI image archives" "$out"
info "images: $(cd "$WORK/images" && du -h ./*.tar | awk '{printf "%s %s  ", $2, $1}')"

mkdir -p "$WORK/imgbin" && cp "$BIN/ebpf-cni" "$BIN/host-local" "$BIN/loopback" "$WORK/imgbin/"

# install_by_hand: what the DaemonSet's init container does, run on the host.
install_by_hand() {
	"$BIN/install-cni" -bin-src "$WORK/imgbin" -bin-dst "$CNI_BIN" -if-missing "" \
		-conf-src "$WORK/10-ebpf-cni.conflist" -conf-dst "$CNI_CONF" -pod-cidrs "$SUBNET4,$SUBNET6"
}

if [ "$MODE" = full ]; then
	say "deploy/: the manifest, offline"
	deploycheck() {
		cd "$ROOT/test/e2e/deploycheck" &&
			go test -count=1 ./... -args -conflist-out="$WORK/deploy.conflist" 2>&1 | tail -n 20
		return "${PIPESTATUS[0]}"
	}
	check "deploy/ebpf-cni.yaml decodes strictly into k8s.io/api types and keeps the deploy rules (test/e2e/deploycheck)" deploycheck
fi

# ---------------------------------------------------------------- host prerequisites

if ! [ "$(stat -f -c %T /sys/fs/bpf 2>/dev/null)" = bpf_fs ]; then
	mount -t bpf bpffs /sys/fs/bpf || fatal "mount bpffs on /sys/fs/bpf"
	MOUNTED_BPFFS=1
fi

# The plugin conf for the probes and for the conflist. $1: runtimeConfig JSON or empty.
plugin_conf() {
	local rc=${1:-}
	jq -n --arg net "$NET" --arg pin "$PIN" --arg state "$STATE" --arg ipam "$IPAMDIR" \
		--arg s4 "$SUBNET4" --arg s6 "$SUBNET6" --argjson rc "${rc:-null}" '{
		cniVersion: "1.0.0", name: $net, type: "ebpf-cni", mtu: 1500,
		pinDir: $pin, stateDir: $state,
		ipam: {type: "host-local", dataDir: $ipam, ranges: [[{subnet: $s4}], [{subnet: $s6}]]}
	} + (if $rc == null then {} else {runtimeConfig: $rc} end)'
}

# scratch_netns: a network namespace held by a sleeping process (no mount):
# prints its pid; its netns is /proc/PID/ns/net.
scratch_netns() {
	unshare --net sleep 300 >/dev/null 2>&1 &
	local pid=$! self; self=$(readlink /proc/self/ns/net)
	for _ in $(seq 50); do
		[ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" != "$self" ] && break
		sleep 0.02
	done
	echo "$pid"
}

# probe NAME CAPABILITY RUNTIMECONFIG: sets PROBE_RESULT to yes, or no with
# PROBE_WHY. A real ADD (then DEL) through the plugin binary in a scratch netns.
probe() {
	local name=$1 cap=$2 rc=$3 pid out code cid
	cid="e2eprobe-$cap-$ID"
	pid=$(scratch_netns); SCRATCH_PIDS+=("$pid")
	local env=(CNI_CONTAINERID="$cid" CNI_NETNS="/proc/$pid/ns/net" CNI_IFNAME=eth0 CNI_PATH="$BIN")
	out=$(plugin_conf "$rc" | env "${env[@]}" CNI_COMMAND=ADD "$BIN/ebpf-cni" 2>&1)
	local add_rc=$?
	local del; del=$(plugin_conf "$rc" | env "${env[@]}" CNI_COMMAND=DEL "$BIN/ebpf-cni" 2>&1) ||
		fail "probe $cap: DEL after the probe ADD" "$del"
	kill -9 "$pid" 2>/dev/null
	if [ $add_rc -eq 0 ]; then
		PROBE_RESULT=yes
		return
	fi
	code=$(jq -r '.code // empty' <<<"$out" 2>/dev/null)
	PROBE_WHY=$(jq -r '.msg // empty' <<<"$out" 2>/dev/null)
	[ -n "$PROBE_WHY" ] || PROBE_WHY=$out
	if [ "$code" = 2 ]; then
		PROBE_RESULT=no
		PROBE_WHY="the plugin rejects runtimeConfig.$cap (CNI error 2: $PROBE_WHY)"
	else
		PROBE_RESULT=error
		fail "$name: probe ADD with runtimeConfig.$cap failed (not as unsupported)" "$out"
	fi
}

HOSTPORT=no BANDWIDTH=no
HOSTPORT_WHY="short mode" BANDWIDTH_WHY="short mode"
if [ "$MODE" = full ]; then
	say "capabilities of the plugin"
	case ${EBPF_E2E_HOSTPORT:-auto} in
	reference)
		# Harness self-test: the reference portmap plugin (iptables) chained
		# after ebpf-cni provides hostPort, to prove the hostPort checks
		# themselves. portmap's top-level iptables chains are removed at the
		# end unless they existed before.
		command -v iptables >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null; }
		iptables -t nat -S CNI-HOSTPORT-DNAT >/dev/null 2>&1 || PORTMAP_CHAINS_OURS=1
		out=$(go build -o "$BIN/" github.com/containernetworking/plugins/plugins/meta/portmap 2>&1) || fatal "build portmap" "$out"
		cp "$BIN/portmap" "$CNI_BIN/"
		HOSTPORT=reference; info "portMappings: the reference portmap plugin, chained (EBPF_E2E_HOSTPORT=reference)" ;;
	1) HOSTPORT=yes; info "portMappings: on (EBPF_E2E_HOSTPORT=1)" ;;
	0) HOSTPORT_WHY="disabled by EBPF_E2E_HOSTPORT=0"; info "portMappings: $HOSTPORT_WHY" ;;
	*)
		probe hostPort portMappings "{\"portMappings\": [{\"hostPort\": $HP_PROBE, \"containerPort\": 8080, \"protocol\": \"tcp\"}]}"
		HOSTPORT=$PROBE_RESULT; HOSTPORT_WHY=${PROBE_WHY:-}
		info "portMappings: $HOSTPORT${HOSTPORT_WHY:+ ($HOSTPORT_WHY)}"
		;;
	esac
	PROBE_WHY=
	bwrc='{"bandwidth": {"ingressRate": 20000000, "ingressBurst": 4294967295, "egressRate": 10000000, "egressBurst": 4294967295}}'
	case ${EBPF_E2E_BANDWIDTH:-auto} in
	1) BANDWIDTH=yes; info "bandwidth: on (EBPF_E2E_BANDWIDTH=1)" ;;
	0) BANDWIDTH_WHY="disabled by EBPF_E2E_BANDWIDTH=0"; info "bandwidth: $BANDWIDTH_WHY" ;;
	*)
		probe bandwidth bandwidth "$bwrc"
		BANDWIDTH=$PROBE_RESULT; BANDWIDTH_WHY=${PROBE_WHY:-}
		info "bandwidth: $BANDWIDTH${BANDWIDTH_WHY:+ ($BANDWIDTH_WHY)}"
		;;
	esac
fi

# DECLARED: the conflist whose capabilities the product declares (the
# ConfigMap's when deploycheck extracted it, else the shipped one).
DECLARED=$ROOT/deploy/10-ebpf-cni.conflist
[ -s "$WORK/deploy.conflist" ] && DECLARED=$WORK/deploy.conflist
declared() { jq -e --arg c "$1" '.plugins[0].capabilities[$c] // false' "$DECLARED" >/dev/null; }
# unavailable CAP WHY CHECK...: the checks of a capability the plugin does
# not provide. Declared by the conflist: each fails (a pod asking for it
# would fail); left out on purpose (EBPF_E2E_*=0): each is skipped.
unavailable() {
	local cap=$1 why=$2 c; shift 2
	for c in "$@"; do
		if declared "$cap" && [[ $why != disabled* ]]; then
			fail "$c" "$(basename "$DECLARED") declares $cap, the plugin does not provide it: $why"
		else
			skip "$c" "$why"
		fi
	done
}

# The conflist. Full mode: the ConfigMap's, as deployed (its "__PODCIDR__"
# range is filled in by install-cni), with this run's network name, pins,
# state and IPAM directories. Short mode: the same fields, written here.
# Capabilities: exactly what the plugin has (a declared one it rejects would
# fail every pod with port mappings or bandwidth annotations).
caps='{}' chain='[]'
[ "$HOSTPORT" = reference ] && chain='[{"type": "portmap", "capabilities": {"portMappings": true}}]'
[ "$HOSTPORT" = yes ] && caps=$(jq -c '. + {portMappings: true}' <<<"$caps")
[ "$BANDWIDTH" = yes ] && caps=$(jq -c '. + {bandwidth: true}' <<<"$caps")
if [ "$MODE" = full ] && [ -s "$WORK/deploy.conflist" ]; then
	base=$(cat "$WORK/deploy.conflist"); from="the ConfigMap of deploy/ebpf-cni.yaml"
	# declared_ok: the ConfigMap declares no capability the plugin rejects.
	declared_ok() {
		local c bad=0
		for c in $(jq -r '.plugins[0].capabilities // {} | keys[]' <<<"$base"); do
			case $c in
			portMappings) [ "$HOSTPORT" = yes ] || { echo "declares portMappings: ${HOSTPORT_WHY:-hostPort off}"; bad=1; } ;;
			bandwidth) [ "$BANDWIDTH" = yes ] || { echo "declares bandwidth: ${BANDWIDTH_WHY:-bandwidth off}"; bad=1; } ;;
			*) echo "declares unknown capability $c"; bad=1 ;;
			esac
		done
		return $bad
	}
	check "the ConfigMap declares only capabilities the plugin accepts" declared_ok
	for c in portMappings bandwidth; do
		jq -e --arg c "$c" '.plugins[0].capabilities[$c] // false' <<<"$base" >/dev/null ||
			{ jq -e --arg c "$c" '.[$c] // false' <<<"$caps" >/dev/null && info "note: the plugin accepts $c but the ConfigMap does not declare it"; }
	done
else
	base=$(plugin_conf | jq '{cniVersion, name, plugins: [del(.cniVersion, .name)]}'); from="test/e2e/run.sh"
fi
jq --arg net "$NET" --arg pin "$PIN" --arg state "$STATE" --arg ipam "$IPAMDIR" --argjson caps "$caps" --argjson chain "$chain" '
	.name = $net
	| .plugins[0] |= (del(.capabilities) + {pinDir: $pin, stateDir: $state}
		# No API server here, so no agent programs NetworkPolicy: with the
		# ConfigMap'"'"'s "networkPolicy": true every pod would stay pending
		# (closed but to the node). test/k8s runs it with policies.
		| del(.networkPolicy)
		+ (if $caps == {} then {} else {capabilities: $caps} end)
		| .ipam.dataDir = $ipam)
	| .plugins += $chain' <<<"$base" >"$WORK/10-ebpf-cni.conflist" || fatal "write the conflist" "$base"
info "conflist from $from: network $NET, capabilities $caps, pinDir $PIN, pod CIDRs $SUBNET4,$SUBNET6"

# ---------------------------------------------------------------- containerd

say "containerd (own root, state, socket, config; private mount namespace)"
mkdir -p "$WORK"/{root,state,opt,ovl/run/upper,ovl/run/work,ovl/varlib/upper,ovl/varlib/work}
cat >"$WORK/config.toml" <<EOF
version = 2
root = "$WORK/root"
state = "$WORK/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = ""
  level = "info"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$WORK/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$IMG_PAUSE"
  # runc cannot raise oom_score_adj without CAP_SYS_RESOURCE (this VM has none)
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$CNI_CONF"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # no systemd on the node: cgroupfs driver
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
EOF
cat >"$WORK/crictl.yaml" <<EOF
runtime-endpoint: unix://$SOCK
image-endpoint: unix://$SOCK
timeout: 30
debug: false
pull-image-on-create: false
EOF

if [ "$MODE" = short ]; then
	# The node has the plugin before the runtime starts.
	out=$(install_by_hand 2>&1) || fatal "install-cni on the host" "$out"
fi
# In a private mount namespace /run and /var/lib are overlays (writes go to
# $WORK/ovl): the shims' sockets (hard-wired to /run/containerd/s), runc's
# state, the pods' netns mounts and libcni's cache (/var/lib/cni) stay ours.
unshare --mount --propagation private sh -c '
	set -e
	mount -t overlay overlay -o lowerdir=/run,upperdir="$1/ovl/run/upper",workdir="$1/ovl/run/work" /run
	mount -t overlay overlay -o lowerdir=/var/lib,upperdir="$1/ovl/varlib/upper",workdir="$1/ovl/varlib/work" /var/lib
	exec containerd --config "$1/config.toml"
' sh "$WORK" >"$WORK/containerd.log" 2>&1 &
CTRD_PID=$!
for _ in $(seq 100); do
	[ -S "$SOCK" ] && ctr --address "$SOCK" version >/dev/null 2>&1 && break
	alive "$CTRD_PID" || break
	sleep 0.1
done
ctr --address "$SOCK" version >/dev/null 2>&1 || fatal "containerd starts" "$(tail -n 20 "$WORK/containerd.log")"
pass "containerd $(ctr --address "$SOCK" version 2>/dev/null | awk '/Version/{print $2; exit}') up on $SOCK (pid $CTRD_PID)"

# pod_exec NETNS CMD...: CMD in a pod's network namespace. NETNS is the path
# crictl inspectp reports, which exists in containerd's mount namespace: enter
# that first, then the netns by path (nsenter opens every path before it
# switches, so it takes two). Not `ip netns exec`: that remounts /sys.
pod_exec() {
	local ns=$1; shift
	nsenter --mount="/proc/$CTRD_PID/ns/mnt" -- nsenter --net="$ns" -- "$@"
}

say "images (OCI archives, no registry)"
for i in pause httpd ebpf-cni; do
	[ "$MODE" = short ] && [ $i = ebpf-cni ] && continue
	out=$(ctr_ images import "$WORK/images/$i.tar" 2>&1) || fatal "ctr images import $i.tar" "$out"
done
images_known() {
	local l; l=$(cri images -o json | jq -r '.images[].repoTags[]')
	echo "$l"
	grep -qx "$IMG_PAUSE" <<<"$l" && grep -qx "$IMG_HTTPD" <<<"$l"
}
check "images known to CRI" images_known || exit 1

network_ready() { cri info 2>/dev/null | jq -e '.status.conditions[] | select(.type == "NetworkReady") | .status == true' >/dev/null; }
not() { ! "$@"; }

# ---------------------------------------------------------------- pods

# pod_json NAME HOSTPORT [bandwidth annotations JSON] [network mode]
pod_json() {
	local name=$1 hp=$2 ann=${3:-'{}'} netmode=${4:-0}
	mkdir -p "$WORK/logs/$name"
	jq -n --arg name "$name" --arg id "$ID" --arg logs "$WORK/logs/$name" --argjson hp "$hp" \
		--argjson ann "$ann" --arg cg "/$CGPARENT" --argjson netmode "$netmode" '{
		metadata: {name: $name, namespace: "ebpf-e2e", uid: ($name + "-" + $id), attempt: 0},
		hostname: $name, log_directory: $logs,
		labels: {app: "ebpf-e2e"},
		annotations: $ann,
		linux: {cgroup_parent: $cg, security_context: {namespace_options: {network: $netmode}}}
	} + (if $hp > 0 then {port_mappings: [{protocol: 0, container_port: 8080, host_port: $hp}]} else {} end)' \
		>"$WORK/pod-$name.json"
	echo "$WORK/pod-$name.json"
}

httpd_json() {
	jq -n --arg img "$IMG_HTTPD" '{
		metadata: {name: "httpd"}, image: {image: $img}, log_path: "httpd.log",
		envs: [{key: "PORT", value: "8080"}],
		linux: {security_context: {readonly_rootfs: true, run_as_user: {value: 65534},
			capabilities: {drop_capabilities: ["ALL"]}}}
	}' >"$WORK/ctr-httpd.json"
	echo "$WORK/ctr-httpd.json"
}

# run_pod NAME HOSTPORT ANNOTATIONS: runp + create + start httpd; sets
# POD_<NAME>, NS_<NAME>, IP4_<NAME>, IP6_<NAME>.
run_pod() {
	local name=$1 var=${1#e2e-}; var=${var^^}
	local pj cj pod c out
	local ann=${3:-}; [ -n "$ann" ] || ann='{}'
	pj=$(pod_json "$name" "$2" "$ann")
	cj=$(httpd_json)
	if ! pod=$(cri runp "$pj" 2>&1); then fail "runp $name" "$pod"; return 1; fi
	SANDBOXES+=("$pod")
	local insp; insp=$(cri inspectp -o json "$pod")
	local ip4 ip6 ns
	ip4=$(jq -r '.status.network.ip // empty' <<<"$insp")
	ip6=$(jq -r '[.status.network.additionalIps[]?.ip] | map(select(contains(":"))) | .[0] // empty' <<<"$insp")
	ns=$(jq -r '.info.runtimeSpec.linux.namespaces[] | select(.type == "network") | .path' <<<"$insp")
	printf -v "POD_$var" %s "$pod"; printf -v "NS_$var" %s "$ns"
	printf -v "IP4_$var" %s "$ip4"; printf -v "IP6_$var" %s "$ip6"
	HOSTIFS[$pod]=$(record_hostif "$pod")
	[ -n "${HOSTIFS[$pod]}" ] || { fail "runp $name: the plugin's record of sandbox ${pod:0:13}" "$("$BIN/ebpf-agent" dump attachments --state-dir "$STATE" 2>&1)"; return 1; }
	pass "runp $name: sandbox ${pod:0:13}, $ip4 $ip6, host veth $(hostif "$pod")"
	if ! c=$(cri create "$pod" "$cj" "$pj" 2>&1) || ! out=$(cri start "$c" 2>&1); then
		fail "create+start httpd in $name" "$c $out"; return 1
	fi
	printf -v "CTR_$var" %s "$c"
	pass "httpd container started in $name"
}

# http URL [curl args...]: GET with a short timeout, body on stdout.
http() { curl -sS --fail -m 5 "$@"; }
want_host() { # want_host NAME CMD...: CMD's output names pod NAME
	local name=$1; shift
	local out; out=$("$@" 2>&1) || { echo "$out"; return 1; }
	echo "$out"
	grep -q "hostname=$name " <<<"$out" || { echo "expected hostname=$name"; return 1; }
}
wait_http() { # wait_http URL: until the server answers (10 s)
	for _ in $(seq 100); do http -m 1 "$1" >/dev/null 2>&1 && break; sleep 0.1; done
	http "$1"
}

# installed CONTAINER: the init container exited 0 and the node has plugin + conflist.
installed() {
	local code; code=$(cri inspect -o json "$1" | jq -r .status.exitCode)
	cat "$WORK/logs/ebpf-cni-node/install-cni.log"; ls -l "$CNI_BIN" "$CNI_CONF"
	[ "$code" = 0 ] && [ -x "$CNI_BIN/ebpf-cni" ] && [ -x "$CNI_BIN/host-local" ] && [ -x "$CNI_BIN/loopback" ] &&
		jq -e --arg s4 "$SUBNET4" --arg s6 "$SUBNET6" '.plugins[0].type == "ebpf-cni" and
			.plugins[0].ipam.ranges == [[{subnet: $s4}], [{subnet: $s6}]]' "$CNI_CONF/10-ebpf-cni.conflist" >/dev/null
}
# agent_ready CONTAINER: the agent logged its datapath and runs with exactly
# CAP_NET_ADMIN (12), CAP_PERFMON (38) and CAP_BPF (39) effective.
agent_ready() {
	local pid caps seccomp
	cat "$WORK/logs/ebpf-cni-node/agent.log"
	grep -q 'datapath ready' "$WORK/logs/ebpf-cni-node/agent.log" || return 1
	pid=$(cri inspect -o json "$1" | jq -r .info.pid)
	caps=$(awk '/^CapEff/{print $2}' "/proc/$pid/status")
	seccomp=$(awk '/^Seccomp:/{print $2}' "/proc/$pid/status")
	echo "CapEff=$caps Seccomp=$seccomp (2: filter)"
	[ "$caps" = 000000c000001000 ] && [ "$seccomp" = 2 ]
}

say "network ready"
if [ "$MODE" = full ]; then
	# As on a fresh node: the runtime starts with an empty CNI conf dir and
	# reports NetworkReady=false until the DaemonSet's init container (same
	# binary, same image layout as deploy/Dockerfile) installs the plugin.
	check "NetworkReady=false before the plugin is installed" not network_ready
	jq -n --arg id "$ID" --arg logs "$WORK/logs/ebpf-cni-node" --arg cg "/$CGPARENT" '{
		metadata: {name: "ebpf-cni-node", namespace: "kube-system", uid: ("ebpf-cni-node-" + $id), attempt: 0},
		log_directory: $logs, labels: {"k8s-app": "ebpf-cni"},
		linux: {cgroup_parent: $cg, security_context: {namespace_options: {network: 2}}}
	}' >"$WORK/pod-node.json"
	mkdir -p "$WORK/logs/ebpf-cni-node"
	# The DaemonSet's containers, with its mounts and security contexts (see deploy/ebpf-cni.yaml).
	jq -n --arg img "$IMG_CNI" --arg bin "$CNI_BIN" --arg conf "$CNI_CONF" --arg cm "$WORK/10-ebpf-cni.conflist" \
		--arg cidrs "$SUBNET4,$SUBNET6" '{
		metadata: {name: "install-cni"}, image: {image: $img}, log_path: "install-cni.log",
		command: ["/usr/local/bin/install-cni"], envs: [{key: "POD_CIDRS", value: $cidrs}],
		mounts: [
			{container_path: "/host/opt/cni/bin", host_path: $bin},
			{container_path: "/host/etc/cni/net.d", host_path: $conf},
			{container_path: "/etc/ebpf-cni/10-ebpf-cni.conflist", host_path: $cm, readonly: true}],
		linux: {security_context: {readonly_rootfs: true, capabilities: {drop_capabilities: ["ALL"]}}}
	}' >"$WORK/ctr-install.json"
	# The agent reconciles the networks of the node's conflists: it sees the
	# CNI dirs where the DaemonSet mounts them, and the run's state and IPAM
	# directories at the paths the conflist names. Metrics on a free port.
	jq -n --arg img "$IMG_CNI" --arg pin "$PIN" --arg state "$STATE" --arg ipam "$IPAMDIR" \
		--arg bin "$CNI_BIN" --arg conf "$CNI_CONF" '{
		metadata: {name: "agent"}, image: {image: $img}, log_path: "agent.log",
		command: ["/usr/local/bin/ebpf-agent"],
		args: ["run", "--pin-dir", $pin, "--state-dir", $state, "--metrics-addr", "127.0.0.1:0"],
		mounts: [{container_path: "/sys/fs/bpf", host_path: "/sys/fs/bpf"},
			{container_path: $state, host_path: $state}, {container_path: $ipam, host_path: $ipam},
			{container_path: "/etc/cni/net.d", host_path: $conf, readonly: true},
			{container_path: "/opt/cni/bin", host_path: $bin, readonly: true}],
		linux: {security_context: {readonly_rootfs: true, seccomp: {profile_type: 0},
			capabilities: {drop_capabilities: ["ALL"], add_capabilities: ["NET_ADMIN", "BPF", "PERFMON"]}}}
	}' >"$WORK/ctr-agent.json"
	if NODEPOD=$(cri runp "$WORK/pod-node.json" 2>&1); then
		SANDBOXES+=("$NODEPOD")
		pass "runp ebpf-cni-node (hostNetwork, as the DaemonSet's pod)"
		if c=$(cri create "$NODEPOD" "$WORK/ctr-install.json" "$WORK/pod-node.json" 2>&1) && cri start "$c" >/dev/null 2>&1; then
			for _ in $(seq 100); do
				[ "$(cri inspect -o json "$c" | jq -r .status.state)" = CONTAINER_EXITED ] && break
				sleep 0.1
			done
			check "init container install-cni exits 0, installs the plugin and the conflist with the node's pod CIDRs" installed "$c"
		else
			fail "create+start install-cni" "$c"
		fi
		if c=$(cri create "$NODEPOD" "$WORK/ctr-agent.json" "$WORK/pod-node.json" 2>&1) && cri start "$c" >/dev/null 2>&1; then
			for _ in $(seq 100); do
				grep -q "datapath ready" "$WORK/logs/ebpf-cni-node/agent.log" 2>/dev/null && break
				[ "$(cri inspect -o json "$c" | jq -r .status.state)" = CONTAINER_EXITED ] && break
				sleep 0.1
			done
			check "agent container: ebpf-agent run with only NET_ADMIN, BPF, PERFMON (RuntimeDefault seccomp) owns $PIN" agent_ready "$c"
		else
			fail "create+start agent container" "$c"
		fi
	else
		fail "runp ebpf-cni-node" "$NODEPOD"
	fi
	# If the installer failed, install by hand so the pod checks still run.
	[ -x "$CNI_BIN/ebpf-cni" ] && [ -f "$CNI_CONF/10-ebpf-cni.conflist" ] || install_by_hand >/dev/null 2>&1
fi
for _ in $(seq 100); do network_ready && break; sleep 0.1; done
check "CRI reports NetworkReady (conflist loaded from the node's conf dir)" network_ready ||
	fatal "network never became ready" "$(cri info 2>&1 | jq '.status' 2>&1; tail -n 5 "$WORK/containerd.log")"

say "pods"
BW_ANN='{"kubernetes.io/egress-bandwidth": "10M", "kubernetes.io/ingress-bandwidth": "20M"}'
run_pod e2e-a "$HP_A" '{}' || fatal "pod e2e-a"
if [ "$MODE" = full ]; then
	run_pod e2e-b "$HP_B" "$BW_ANN" || fatal "pod e2e-b"
fi
in_subnets() { echo "$1 $2"; [[ $1 == 10.199.$OCT.* ]] && [[ $2 == fd00:199:$OCT:* ]]; }
check "pod e2e-a has addresses in $SUBNET4 and $SUBNET6" in_subnets "$IP4_A" "$IP6_A"

say "reachability"
check "node -> pod e2e-a $IP4_A:8080 (HTTP)" want_host e2e-a wait_http "http://$IP4_A:8080/"
if [ "$MODE" = full ]; then
	check "node -> pod e2e-a [$IP6_A]:8080 (HTTP over IPv6)" want_host e2e-a http -g "http://[$IP6_A]:8080/"
	check "node -> pod e2e-b $IP4_B:8080" want_host e2e-b wait_http "http://$IP4_B:8080/"
	check "pod e2e-a -> pod e2e-b $IP4_B:8080 (from inside A's netns)" want_host e2e-b pod_exec "$NS_A" curl -sS --fail -m 5 "http://$IP4_B:8080/"
	check "pod e2e-b -> pod e2e-a $IP4_A:8080" want_host e2e-a pod_exec "$NS_B" curl -sS --fail -m 5 "http://$IP4_A:8080/"
	check "pod e2e-a -> pod e2e-b [$IP6_B]:8080 (IPv6)" want_host e2e-b pod_exec "$NS_A" curl -sS --fail -m 5 -g "http://[$IP6_B]:8080/"
	client_is() { # client_is IP CMD...: the server saw IP as the client
		local ip=$1; shift
		local out; out=$("$@" 2>&1); echo "$out"; grep -q "client=$ip:" <<<"$out"
	}
	check "pod e2e-b sees pod e2e-a's address as the client (no NAT pod to pod)" client_is "$IP4_A" pod_exec "$NS_A" curl -sS --fail -m 5 "http://$IP4_B:8080/"
	check "ping pod e2e-a -> pod e2e-b" pod_exec "$NS_A" ping -c 2 -i 0.2 -W 2 "$IP4_B"
fi
dump() { "$BIN/ebpf-agent" dump endpoints --pin-dir "$PIN" --state-dir "$STATE" -o json; }
dump_lists() { # dump_lists IP HOSTIF NAME
	local d; d=$(dump) || return 1
	jq -c '.[] | {ip, interface, pod, rxPackets, txPackets}' <<<"$d"
	jq -e --arg ip "$1" --arg ifn "$2" --arg name "$3" \
		'any(.[]; .ip == $ip and .interface == $ifn and (.pod // "" | contains($name)) and .txPackets > 0)' <<<"$d" >/dev/null
}
check "ebpf-agent dump endpoints lists pod e2e-a (IP, host veth, pod name, traffic)" dump_lists "$IP4_A" "$(hostif "$POD_A")" e2e-a
metrics_url() { grep -o 'metrics on http://[^ ]*' "$WORK/logs/ebpf-cni-node/agent.log" 2>/dev/null | tail -n 1 | cut -d' ' -f3; }
metrics() { local u; u=$(metrics_url); [ -n "$u" ] && curl -sS --fail -m 5 "$u"; }
# agent_metrics N: the agent's metrics say healthy and N pod addresses.
agent_metrics() {
	local m; m=$(metrics) || { echo "no metrics from the agent"; return 1; }
	grep -E '^ebpf_cni_(datapath_healthy|endpoints) ' <<<"$m"
	grep -qx 'ebpf_cni_datapath_healthy 1' <<<"$m" && grep -qx "ebpf_cni_endpoints $1" <<<"$m"
}
if [ "$MODE" = full ]; then
	check "agent metrics: datapath healthy, 4 pod addresses (2 pods, dual stack)" agent_metrics 4
fi

# ---------------------------------------------------------------- hostPort

if [ "$MODE" = full ]; then
	say "hostPort (pod e2e-a: $HP_A -> 8080, pod e2e-b: $HP_B -> 8080)"
	NODE_IF=$(ip -4 route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')
	NODE_IP=$(ip -4 -o addr show dev "${NODE_IF:-lo}" scope global 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
	NODE_IP6=$(ip -6 -o addr show dev "${NODE_IF:-lo}" scope global 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
	if [ "$HOSTPORT" != yes ] && [ "$HOSTPORT" != reference ]; then
		unavailable portMappings "${HOSTPORT_WHY:-not supported}" \
			"hostPort from another namespace routed to the node" "hostPort from another namespace, second pod" "hostPort from another namespace over IPv6" \
			"hostPort from the node to its address" "hostPort from the node to 127.0.0.1" "hostPort from the node to [::1]" \
			"hostPort from a pod to its own hostPort (hairpin)" "hostPort from a pod to another pod's hostPort"
	elif [ -z "$NODE_IP" ]; then
		skip "hostPort checks" "the node has no global IPv4 address on its default route's interface"
	else
		info "node address $NODE_IP${NODE_IP6:+, $NODE_IP6} ($NODE_IF)"
		# A "remote host": a namespace behind a veth, routed to the node.
		CLIENT_PID=$(scratch_netns)
		ip link add "e2eup$ID" type veth peer name "e2ecl$ID" &&
			ip link set "e2ecl$ID" netns "$CLIENT_PID" &&
			ip addr add "10.198.$OCT.1/30" dev "e2eup$ID" && ip addr add "fd00:198:$OCT::1/64" dev "e2eup$ID" nodad &&
			ip link set "e2eup$ID" up &&
			nsenter --net="/proc/$CLIENT_PID/ns/net" sh -c "ip link set lo up && ip addr add 10.198.$OCT.2/30 dev e2ecl$ID &&
				ip addr add fd00:198:$OCT::2/64 dev e2ecl$ID nodad && ip link set e2ecl$ID up &&
				ip route add default via 10.198.$OCT.1 && ip -6 route add default via fd00:198:$OCT::1" ||
			fail "remote namespace wiring"
		client() { nsenter --net="/proc/$CLIENT_PID/ns/net" -- "$@"; }
		# The uplink towards the new namespace appeared just now: the agent
		# attaches the hostPort program to it on the link/address event
		# (debounced 200 ms). Give it a few seconds, as a real node's uplinks
		# exist long before its pods.
		retry() { local i; for i in $(seq 1 25); do "$@" && return 0; sleep 0.2; done; "$@"; }
		check "hostPort from another namespace routed to the node ($NODE_IP:$HP_A)" want_host e2e-a retry client curl -sS --fail -m 5 "http://$NODE_IP:$HP_A/"
		check "hostPort from another namespace, second pod ($NODE_IP:$HP_B)" want_host e2e-b client curl -sS --fail -m 5 "http://$NODE_IP:$HP_B/"
		if [ -n "$NODE_IP6" ]; then
			check "hostPort from another namespace over IPv6 ([$NODE_IP6]:$HP_A)" want_host e2e-a client curl -sS --fail -m 5 -g "http://[$NODE_IP6]:$HP_A/"
		else
			skip "hostPort from another namespace over IPv6" "the node has no global IPv6 address on $NODE_IF"
		fi
		check "hostPort from the node to its address ($NODE_IP:$HP_A)" want_host e2e-a http "http://$NODE_IP:$HP_A/"
		check "hostPort from the node to 127.0.0.1:$HP_A" want_host e2e-a http "http://127.0.0.1:$HP_A/"
		check "hostPort from the node to [::1]:$HP_A" want_host e2e-a http -g "http://[::1]:$HP_A/"
		check "hostPort from a pod to its own hostPort (hairpin, $NODE_IP:$HP_A)" want_host e2e-a pod_exec "$NS_A" curl -sS --fail -m 5 "http://$NODE_IP:$HP_A/"
		check "hostPort from a pod to another pod's hostPort ($NODE_IP:$HP_B)" want_host e2e-b pod_exec "$NS_A" curl -sS --fail -m 5 "http://$NODE_IP:$HP_B/"
	fi
fi

# ---------------------------------------------------------------- bandwidth

# rate_check NAME LIMIT_BITS CMD...: CMD is a curl printing "bytes seconds";
# passes when the achieved rate is within [0.5, 1.2] x LIMIT.
rate_check() {
	local name=$1 limit=$2; shift 2
	local out; out=$("$@" 2>&1) || { fail "$name" "$out"; return; }
	local verdict
	verdict=$(awk -v l="$limit" '{r = $1 * 8 / $2; printf "%.2f Mbit/s (%d bytes in %.2fs) against a limit of %.0f Mbit/s: ", r / 1e6, $1, $2, l / 1e6;
		if (r <= 1.2 * l && r >= 0.5 * l) print "ok"; else print "out of [0.5, 1.2] x limit"}' <<<"$out")
	if [[ $verdict == *": ok" ]]; then pass "$name: $verdict"; else fail "$name" "$verdict"; fi
}
if [ "$MODE" = full ]; then
	say "bandwidth (pod e2e-b: egress 10M, ingress 20M; pod e2e-a unlimited)"
	N_EG=3750000 N_IN=7500000   # ~3 s each at the limit
	if [ "$BANDWIDTH" != yes ]; then
		unavailable bandwidth "${BANDWIDTH_WHY:-not supported}" \
			"bandwidth egress limit (download from the pod)" "bandwidth ingress limit (upload to the pod)" "bandwidth egress limit pod to pod"
	else
		head -c "$N_IN" /dev/zero >"$WORK/upload.bin"
		fmt='%{size_download} %{time_total}\n'
		above() { # above BITS CMD...: CMD's "bytes seconds" is faster than BITS/s
			local b=$1; shift
			local out; out=$("$@" 2>&1) || { echo "$out"; return 1; }
			awk -v b="$b" '{r = $1 * 8 / $2; printf "%.1f Mbit/s\n", r / 1e6; exit !(r > b)}' <<<"$out"
		}
		check "bandwidth baseline: pod e2e-a (no limit) sends above 50 Mbit/s" above 50000000 \
			curl -sS --fail -m 20 -o /dev/null -w "$fmt" "http://$IP4_A:8080/bytes?n=$N_EG"
		rate_check "bandwidth egress limit (download from pod e2e-b)" 10000000 \
			curl -sS --fail -m 30 -o /dev/null -w "$fmt" "http://$IP4_B:8080/bytes?n=$N_EG"
		rate_check "bandwidth ingress limit (upload to pod e2e-b)" 20000000 \
			curl -sS --fail -m 30 -o /dev/null -w '%{size_upload} %{time_total}\n' --data-binary "@$WORK/upload.bin" "http://$IP4_B:8080/sink"
		rate_check "bandwidth egress limit pod to pod (e2e-a downloads from e2e-b)" 10000000 \
			pod_exec "$NS_A" curl -sS --fail -m 30 -o /dev/null -w "$fmt" "http://$IP4_B:8080/bytes?n=$N_EG"
	fi
fi

# ---------------------------------------------------------------- removal

say "stopp + rmp: nothing may remain"
remove_pod() { cri stopp "$1" && cri rmp "$1"; }
NODEPOD=${NODEPOD:-}
for p in "${SANDBOXES[@]}"; do
	[ "$p" = "$NODEPOD" ] && continue # the DaemonSet's pod goes last, as on a node
	check "stopp + rmp ${p:0:13}" remove_pod "$p"
done
none() { # none CMD...: CMD prints nothing (what it prints is what was left)
	local out; out=$("$@" 2>&1); [ -z "$out" ] && return 0
	echo "left: $out"; return 1
}
pods_left() { cri pods -q; }
veths_left() {
	local s n
	for s in "${SANDBOXES[@]}"; do
		n=$(hostif "$s"); [ -n "$n" ] && ip link show "$n" >/dev/null 2>&1 && echo "$n"
	done
}
endpoints_left() { local d; d=$(dump) || { echo "dump failed"; return; }; [ "$(jq length <<<"$d")" = 0 ] || echo "$d"; }
ipam_left() { find "$IPAMDIR" -type f ! -name lock ! -name 'last_reserved_ip.*'; }
pins_left() { find "$PIN/links" -mindepth 1 2>/dev/null; } # links/ holds per-pod link pins only (node-wide ones are under node/)
records_left() { find "$STATE" -type f; }
routes_left() {
	ip -4 route show | grep -F "10.199.$OCT."
	ip -6 route show | grep -F "fd00:199:$OCT:"
	ip neigh show | grep -E "^(10\.199\.$OCT\.|fd00:199:$OCT:)"
}
netns_left() {
	nsenter --mount="/proc/$CTRD_PID/ns/mnt" -- sh -c 'grep -F /run/netns/cni- /proc/self/mountinfo; ls /run/netns 2>/dev/null | grep ^cni-'
}
cache_left() { find "$WORK/ovl/varlib/upper/cni/results" -type f 2>/dev/null; }
check "no host veth of any pod (ebpf<hash> of each sandbox)" none veths_left
check "no endpoint in the maps (ebpf-agent dump endpoints -o json)" none endpoints_left
check "no host-local reservation" none ipam_left
check "no per-pod link pin" none pins_left
check "no state record" none records_left
check "no route or neighbour to a pod address" none routes_left
check "no pod netns left (containerd's netns mounts)" none netns_left
check "no libcni result cache entry" none cache_left
if [ "$MODE" = full ]; then
	check "agent metrics: 0 pod addresses" agent_metrics 0
	removed=$(metrics | grep '^ebpf_cni_reconcile_removed_total' | tr '\n' ' ')
	info "agent reconciliation during the run removed: ${removed:-nothing}"
	info "(the agent may find state of a pod between its veth going and DEL finishing; informational)"
	[ -n "$NODEPOD" ] && check "stopp + rmp ebpf-cni-node (the DaemonSet's pod; node-wide pins stay, by design)" remove_pod "$NODEPOD"
fi
check "crictl pods: none left" none pods_left
exit 0
