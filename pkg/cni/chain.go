package cni

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
)

// DefaultConfDir is where containerd and CRI-O read conflists by default.
const DefaultConfDir = "/etc/cni/net.d"

// A runtime hands each plugin of a chain its own entry only, so the plugins
// chained after ebpf-cni are known from the conflist file the runtime read:
// the first (in the order runtimes load them) whose name is this network's
// and that lists ebpf-cni. A network whose conflist is not there (a
// configuration passed in memory, Multus delegates) is not checked.

// chainRule says why a plugin chained after ebpf-cni cannot work with it
// and what to use instead, or "" when it works (traffic verified by
// test/integration/chain_test.go).
func chainRule(typ string, p map[string]json.RawMessage, ourCaps map[string]bool) string {
	str := func(key string) string {
		var s string
		_ = json.Unmarshal(p[key], &s)
		return s
	}
	switch typ {
	case "bandwidth":
		// Its qdiscs are bypassed (bpf_redirect_peer skips the host veth's
		// root qdisc, our ingress verdict ends the hook before its ingress
		// filter) or cannot be made (its ingress qdisc and clsact share a slot).
		return `it cannot limit pods of ebpf-cni: pod-to-pod traffic is redirected past its qdiscs, and its ingress qdisc cannot coexist with ebpf-cni's clsact; remove it and declare the "bandwidth" capability on ebpf-cni ("capabilities": {"bandwidth": true}, docs/bandwidth.md)`
	case "portmap":
		if ourCaps["portMappings"] {
			return `it would translate the same hostPorts as ebpf-cni's "portMappings" capability, which this network declares; remove one of them (ebpf-cni's needs no iptables rule, docs/hostport.md)`
		}
	case "tuning":
		var mtu int
		if json.Unmarshal(p["mtu"], &mtu) == nil && mtu != 0 {
			return `"mtu" would set the pod's end of the veth only and leave the host end at another MTU; use ebpf-cni's "mtu" field instead, which sets both ends`
		}
	case "firewall":
		if str("ingressPolicy") == "same-bridge" {
			return `"ingressPolicy": "same-bridge" isolates a bridge, and ebpf-cni has none: pods' traffic to other pods of the node never reaches netfilter; ebpf-cni has no capability that isolates networks, remove the ingressPolicy (the default, "open", works)`
		}
	}
	return ""
}

// checkChain refuses (7) a conflist that chains after ebpf-cni a plugin
// that cannot work with it, naming the plugin, the file and what to use
// instead; before anything is made.
func checkChain(name, confDir string) error {
	if confDir == "" {
		confDir = DefaultConfDir
	}
	file, plugins := findConfList(confDir, name)
	var ourCaps map[string]bool
	ours := false
	for i, p := range plugins {
		var typ string
		_ = json.Unmarshal(p["type"], &typ)
		if !ours {
			if ours = typ == "ebpf-cni"; ours {
				_ = json.Unmarshal(p["capabilities"], &ourCaps)
			}
			continue
		}
		if why := chainRule(typ, p, ourCaps); why != "" {
			return endpoint.ConfError("plugins[%d] of %s: plugin %q chained after ebpf-cni: %s", i, file, typ, why)
		}
	}
	return nil
}

// findConfList returns the plugins of the first conflist in dir (by file
// name, as libcni's ConfFiles sorts them) named name; nil when none is.
func findConfList(dir, name string) (string, []map[string]json.RawMessage) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", nil
	}
	var files []string
	for _, e := range ents {
		switch filepath.Ext(e.Name()) {
		case ".conflist", ".json":
			if !e.IsDir() {
				files = append(files, e.Name())
			}
		}
	}
	sort.Strings(files)
	for _, f := range files {
		path := filepath.Join(dir, f)
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var l struct {
			Name    string                       `json:"name"`
			Plugins []map[string]json.RawMessage `json:"plugins"`
		}
		if json.Unmarshal(b, &l) != nil || l.Name != name || len(l.Plugins) == 0 {
			continue
		}
		return path, l.Plugins
	}
	return "", nil
}
