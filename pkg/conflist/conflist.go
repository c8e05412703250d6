// Package conflist renders the network configuration list the runtime
// reads: a template whose IPAM ranges say "__PODCIDR__" gets one range per
// pod CIDR of the node. install-cni uses it with ranges given on its
// command line; the agent with the ranges of the node's Node object, and
// again whenever they change. Standard library only (install-cni is built
// FROM scratch and stays small).
package conflist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// Placeholder is the subnet value replaced by the node's pod CIDRs.
const Placeholder = "__PODCIDR__"

// Render checks the conflist and replaces placeholder ranges by the pod
// CIDRs (one range set per CIDR: IPv4 and IPv6 on a dual-stack node).
func Render(raw []byte, cidrs []string) ([]byte, error) {
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if s, _ := conf["name"].(string); s == "" {
		return nil, errors.New("name: missing")
	}
	if s, _ := conf["cniVersion"].(string); s == "" {
		return nil, errors.New("cniVersion: missing")
	}
	plugins, _ := conf["plugins"].([]any)
	if len(plugins) == 0 {
		return nil, errors.New("plugins: missing or empty (want a conflist)")
	}
	for _, c := range cidrs {
		if _, _, err := net.ParseCIDR(c); err != nil {
			return nil, fmt.Errorf("pod CIDR %q: %v", c, err)
		}
	}
	for i, p := range plugins {
		pm, _ := p.(map[string]any)
		ipam, _ := pm["ipam"].(map[string]any)
		if ipam == nil || !usesPlaceholder(ipam["ranges"]) {
			continue
		}
		if len(cidrs) == 0 {
			return nil, fmt.Errorf("plugins[%d].ipam.ranges: %s needs the node's pod CIDRs", i, Placeholder)
		}
		var ranges []any
		for _, c := range cidrs {
			ranges = append(ranges, []any{map[string]any{"subnet": c}})
		}
		ipam["ranges"] = ranges
	}
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// UsesPlaceholder tells whether a conflist has a placeholder range.
func UsesPlaceholder(raw []byte) bool {
	var conf struct {
		Plugins []struct {
			IPAM struct {
				Ranges any `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if json.Unmarshal(raw, &conf) != nil {
		return bytes.Contains(raw, []byte(Placeholder))
	}
	for _, p := range conf.Plugins {
		if usesPlaceholder(p.IPAM.Ranges) {
			return true
		}
	}
	return false
}

func usesPlaceholder(ranges any) bool {
	sets, _ := ranges.([]any)
	for _, set := range sets {
		rs, _ := set.([]any)
		for _, r := range rs {
			if m, _ := r.(map[string]any); m != nil && m["subnet"] == Placeholder {
				return true
			}
		}
	}
	return false
}

// WriteAtomic writes b to path through a temporary file in the same
// directory and a rename, so a runtime never reads half a file; it does
// nothing when path already holds b with that mode.
func WriteAtomic(path string, b []byte, mode os.FileMode) (changed bool, err error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		if st, err := os.Stat(path); err == nil && st.Mode().Perm() == mode {
			return false, nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return false, err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return false, err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return false, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return false, err
	}
	if err := f.Close(); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, path)
}

// WithMTU gives every ebpf-cni plugin of a rendered conflist that sets no
// "mtu" this one (the agent's: the uplink's less the tunnel's overhead,
// docs/tunnel.md); a template's own mtu wins. mtu <= 0 leaves it as is.
func WithMTU(raw []byte, mtu int) ([]byte, error) {
	if mtu <= 0 {
		return raw, nil
	}
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	plugins, _ := conf["plugins"].([]any)
	for _, p := range plugins {
		pm, _ := p.(map[string]any)
		if pm == nil || pm["type"] != "ebpf-cni" {
			continue
		}
		if _, set := pm["mtu"]; !set {
			pm["mtu"] = mtu
		}
	}
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
