package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// installCNI puts the CNI under test on every node.
//
//   - reference: ptp + portmap + bandwidth (with host-local and loopback) from
//     containernetworking/plugins at the version go.mod pins, written into
//     each node's /opt/cni/bin and /etc/cni/net.d with the node's pod CIDR.
//   - ebpf-cni: deploy/ebpf-cni.yaml applied with kubectl as it is (the image
//     it names is imported into each node's containerd); its agent writes
//     the conflist with the node's pod CIDRs and routes the other nodes'.
//
// Routes between the nodes' pod CIDRs: for the reference, the static
// host-gw routes podCIDRRoutes added; for ebpf-cni, the agent's.
func (c *cluster) installCNI(ctx context.Context) error {
	if c.o.cni == "reference" {
		for _, n := range c.nodes {
			if err := c.installReference(n); err != nil {
				return fmt.Errorf("%s: %w", n.name, err)
			}
		}
		return nil
	}
	b, err := os.ReadFile(filepath.Join(c.o.repo, "deploy/ebpf-cni.yaml"))
	if err != nil {
		return err
	}
	manifest := string(b)
	if c.o.rollout != "" {
		// The release rolled from: its own manifest and image.
		if manifest, err = c.releaseManifest(); err != nil {
			return err
		}
	}
	if manifest, err = c.tunnelArgs(manifest); err != nil {
		return err
	}
	if c.o.helm {
		if c.o.rollout != "" {
			return fmt.Errorf("-helm and -rollout: use one (the rollout starts from a release's manifest)")
		}
		if err := c.helmInstall(); err != nil {
			return err
		}
	} else if err := c.apply(manifest); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "ebpf-cni DaemonSet ready on every node", 3*time.Minute, func() error {
		out, err := c.kubectl("-n", "kube-system", "get", "daemonset", "ebpf-cni", "-o",
			"jsonpath={.status.numberReady}/{.status.desiredNumberScheduled}")
		if err != nil {
			return err
		}
		if out != fmt.Sprintf("%d/%d", numNodes, numNodes) {
			return fmt.Errorf("ready/desired %s", out)
		}
		return nil
	}); err != nil {
		return err
	}
	if c.o.rollout != "" {
		// An older agent's log lines and capabilities may differ: its routes
		// and conflist are what the cluster needs.
		return c.checkAgentRoutes(ctx)
	}
	return c.checkAgents(ctx)
}

// agentCaps: the capabilities deploy/ebpf-cni.yaml gives the agent
// (CAP_NET_ADMIN 12, CAP_PERFMON 38, CAP_BPF 39), and nothing else.
const agentCaps = 1<<12 | 1<<38 | 1<<39

// checkAgents proves the DaemonSet's agent runs on each node as the
// manifest declares: exactly its capabilities in effect, the node's bpffs
// (the pins are in the node's private bpffs) and the cgroup2 hierarchy
// seen from inside the container (it attached the socket hooks itself).
func (c *cluster) checkAgents(ctx context.Context) error {
	for _, n := range c.nodes {
		pid, err := c.agentPid(n)
		if err != nil {
			return err
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			return err
		}
		var capEff uint64
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
				fmt.Sscanf(strings.TrimSpace(v), "%x", &capEff)
			}
		}
		if capEff != agentCaps {
			return fmt.Errorf("%s: agent (pid %d) has capabilities %#x, the manifest declares %#x", n.name, pid, capEff, agentCaps)
		}
		if _, err := in(n.holder, true, "test", "-d", datapath.MapsDir(datapath.DefaultPinRoot)); err != nil {
			return fmt.Errorf("%s: no maps pinned in the node's bpffs: %w", n.name, err)
		}
		pod, err := c.kubectl("-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=ebpf-cni",
			"--field-selector", "spec.nodeName="+n.name, "-o", "jsonpath={.items[0].metadata.name}")
		if err != nil {
			return err
		}
		// The maps are pinned before the programs load (seconds on a busy
		// machine): wait for the node hooks' line.
		var logs string
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(time.Second) {
			if logs, err = c.kubectl("-n", "kube-system", "logs", pod, "-c", "agent"); err != nil {
				return err
			}
			if strings.Contains(logs, "node hooks (start): cgroup /sys/fs/cgroup") {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: the agent did not attach the socket hooks to cgroup2:\n%s", n.name, tail(logs, 10))
			}
		}
		logf("%s: agent pid %d, capabilities exactly NET_ADMIN BPF PERFMON, pins in the node's bpffs, socket hooks on cgroup2", n.name, pid)
	}
	return c.checkAgentRoutes(ctx)
}

// checkAgentRoutes waits until every node routes every other node's pod
// CIDRs via that node's address with the agent's route protocol, and has
// the conflist with its own pod CIDRs: nothing else routes pods between
// ebpf-cni nodes.
func (c *cluster) checkAgentRoutes(ctx context.Context) error {
	for _, n := range c.nodes {
		var want []string
		for _, m := range c.nodes {
			if m == n {
				continue
			}
			for _, cidr := range m.podCIDRs {
				want = append(want, c.wantPeerRoute(n, m, cidr))
			}
		}
		if err := c.waitFor(ctx, n.name+": the agent's routes to the other nodes' pods", time.Minute, func() error {
			var have []string
			for _, fam := range []string{"-4", "-6"} {
				out, err := in(n.holder, false, "ip", fam, "route", "show", "proto", "199")
				if err != nil {
					return err
				}
				for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
					if r := peerRoute(l); r != "" {
						have = append(have, r)
					}
				}
			}
			sort.Strings(have)
			sort.Strings(want)
			if strings.Join(have, ",") != strings.Join(want, ",") {
				return fmt.Errorf("routes of proto 199: %v, want %v", have, want)
			}
			conf, err := in(n.holder, true, "cat", "/etc/cni/net.d/10-ebpf-cni.conflist")
			if err != nil {
				return err
			}
			for _, cidr := range n.podCIDRs {
				if !strings.Contains(conf, fmt.Sprintf("%q", cidr)) {
					return fmt.Errorf("the conflist lacks the node's pod CIDR %s:\n%s", cidr, conf)
				}
			}
			return nil
		}); err != nil {
			return err
		}
		logf("%s: the agent routes %s and wrote the conflist with %v", n.name, strings.Join(want, ", "), n.podCIDRs)
	}
	return nil
}

// agentPid: the `ebpf-agent run` process in the node's pod cgroups.
func (c *cluster) agentPid(n *node) (int, error) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if !strings.Contains(cmdline(pid), "ebpf-agent run") {
			continue
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if strings.Contains(string(cg), "/"+c.cgName+"/"+n.name+"-pods/") {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("%s: no ebpf-agent process in the node's pods", n.name)
}

func (c *cluster) installReference(n *node) error {
	var ranges, routes []string
	for _, cidr := range n.podCIDRs {
		ranges = append(ranges, fmt.Sprintf("[{ \"subnet\": %q }]", cidr))
		dst := "0.0.0.0/0"
		if strings.Contains(cidr, ":") {
			dst = "::/0"
		}
		routes = append(routes, fmt.Sprintf("{ \"dst\": %q }", dst))
	}
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "reference",
  "plugins": [
    {
      "type": "ptp",
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [%s],
        "routes": [%s]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } },
    { "type": "bandwidth", "capabilities": { "bandwidth": true } }
  ]
}
`, strings.Join(ranges, ", "), strings.Join(routes, ", "))
	staged := filepath.Join(n.dir, "10-reference.conflist")
	if err := os.WriteFile(staged, []byte(conf), 0o644); err != nil {
		return err
	}
	var bins []string
	for _, b := range []string{"ptp", "portmap", "bandwidth", "host-local", "loopback"} {
		bins = append(bins, c.a.path(b))
	}
	// Binaries first, the conflist last (through a rename): the runtime
	// reports the network ready as soon as it sees a conflist.
	script := fmt.Sprintf("set -e\ncp %s /opt/cni/bin/\ncp %s /etc/cni/net.d/.10-reference.conflist.tmp\nmv /etc/cni/net.d/.10-reference.conflist.tmp /etc/cni/net.d/10-reference.conflist\n",
		strings.Join(bins, " "), staged)
	_, err := in(n.holder, true, "/bin/sh", "-c", script)
	return err
}

// coreDNSManifest: CoreDNS as the cluster DNS (kube-dns Service at
// dnsServiceIP), answering for cluster.local and reverse zones only: no
// forward plugin, so no query ever goes upstream.
func coreDNSManifest() string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health {
            lameduck 5s
        }
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        cache 30
        loop
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 2
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations:
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoSchedule}
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              labelSelector:
                matchLabels: {k8s-app: kube-dns}
              topologyKey: kubernetes.io/hostname
      containers:
      - name: coredns
        image: %s
        imagePullPolicy: IfNotPresent
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        - {name: metrics, containerPort: 9153, protocol: TCP}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 10
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config
        configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: %s
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
`, corednsImage, dnsServiceIP)
}

// tunnelArgs adds the -tunnel mode's flags to the agent's arguments in
// deploy/ebpf-cni.yaml (with -helm, helmInstall sets the chart's values).
func (c *cluster) tunnelArgs(manifest string) (string, error) {
	if c.o.tunnel == "" || c.o.helm {
		return manifest, nil
	}
	const anchor = "            - --network-policy\n"
	if strings.Count(manifest, anchor) != 1 {
		return "", fmt.Errorf("deploy/ebpf-cni.yaml: the agent's %q argument, after which -tunnel adds its flags, is not there once", strings.TrimSpace(anchor))
	}
	mode, extra := c.o.tunnel, ""
	if mode == "hybrid" {
		mode, extra = "vxlan", "            - --tunnel-hybrid\n"
	}
	return strings.Replace(manifest, anchor, anchor+"            - --tunnel="+mode+"\n"+extra, 1), nil
}

// helmTunnelValues: helm install's --set for the -tunnel mode.
func (c *cluster) helmTunnelValues() []string {
	switch c.o.tunnel {
	case "":
		return nil
	case "hybrid":
		return []string{"--set", "tunnel.mode=vxlan", "--set", "tunnel.hybrid=true"}
	}
	return []string{"--set", "tunnel.mode=" + c.o.tunnel}
}

// wantPeerRoute: the agent's route on n to m's pod CIDR, as peerRoute
// writes it: host-gw via m's address of the CIDR's family, or into the
// tunnel device toward m's first address (every family: an IPv6 pod CIDR
// rides an IPv4 underlay). Hybrid keeps host-gw within a subnet.
func (c *cluster) wantPeerRoute(n, m *node, cidr string) string {
	if c.o.tunnel == "" || (c.o.tunnel == "hybrid" && n.subnet == m.subnet) {
		return cidr + " via " + m.via(cidr)
	}
	return cidr + " tunnel " + datapath.TunnelDevice + " to " + m.ip
}

// peerRoute normalises a line of `ip route show proto 199`: "CIDR via GW"
// for a host-gw route, "CIDR tunnel DEV to DST" for one carrying a tunnel
// key; "" for anything else.
func peerRoute(l string) string {
	f := strings.Fields(l)
	if len(f) >= 3 && f[1] == "via" {
		return strings.Join(f[:3], " ")
	}
	if len(f) < 2 || f[1] != "encap" {
		return ""
	}
	var dst, dev string
	for i := 1; i+1 < len(f); i++ {
		switch f[i] {
		case "dst":
			if dst == "" {
				dst = f[i+1]
			}
		case "dev":
			dev = f[i+1]
		}
	}
	return f[0] + " tunnel " + dev + " to " + dst
}
