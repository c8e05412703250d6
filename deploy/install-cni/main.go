// Command install-cni is the init container of the ebpf-cni DaemonSet
// (deploy/ebpf-cni.yaml): it copies the CNI binaries shipped in the image to
// the node's CNI bin directory and writes the conflist from the ConfigMap to
// the node's CNI conf directory.
//
//	install-cni [-bin-src /opt/ebpf-cni/cni-bin] [-bin-dst /host/opt/cni/bin]
//	            [-if-missing host-local,loopback]
//	            [-conf-src /etc/ebpf-cni/10-ebpf-cni.conflist] [-conf-dst /host/etc/cni/net.d]
//	            [-pod-cidrs CIDR[,CIDR]]
//
// Every file is written beside its destination and renamed into place, so a
// runtime never execs a half-written plugin nor reads a half-written conflist.
// Unchanged files are left alone, and the binaries named in -if-missing (the
// reference plugins the node may already have from its own CNI package) are
// installed only where the node has none.
//
// Pod CIDR: an IPAM range whose subnet is "__PODCIDR__" is replaced by one
// range set per pod CIDR of this node (IPv4 and IPv6 for dual stack), taken
// from -pod-cidrs ($POD_CIDRS) or, when that is empty, from the Node object
// ($NODE_NAME, spec.podCIDRs) through the in-cluster API with the pod's
// service account (RBAC: get nodes). A conflist without the placeholder is
// installed as it is and needs no API access.
//
// Standard library only and static, so the image can be FROM scratch.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Placeholder is the subnet value replaced by the node's pod CIDRs.
const Placeholder = "__PODCIDR__"

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	binSrc := flag.String("bin-src", "/opt/ebpf-cni/cni-bin", "directory of CNI binaries in the image")
	binDst := flag.String("bin-dst", "/host/opt/cni/bin", "node CNI bin directory (hostPath)")
	ifMissing := flag.String("if-missing", "host-local,loopback", "binaries installed only when the node has none of that name")
	confSrc := flag.String("conf-src", "/etc/ebpf-cni/10-ebpf-cni.conflist", "conflist (ConfigMap)")
	confDst := flag.String("conf-dst", "/host/etc/cni/net.d", "node CNI conf directory (hostPath)")
	podCIDRs := flag.String("pod-cidrs", os.Getenv("POD_CIDRS"), "comma-separated pod CIDRs of this node; empty: ask the API for $NODE_NAME's spec.podCIDRs when the conflist needs them")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("install-cni: ")

	n, err := installBinaries(*binSrc, *binDst, splitList(*ifMissing))
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("%d binaries in %s (%d updated, %d kept as the node had them)", n.total, *binDst, n.updated, n.kept)

	raw, err := os.ReadFile(*confSrc)
	if err != nil {
		log.Fatal(err)
	}
	cidrs := splitList(*podCIDRs)
	if len(cidrs) == 0 && bytes.Contains(raw, []byte(Placeholder)) {
		if cidrs, err = nodePodCIDRs(os.Getenv("NODE_NAME")); err != nil {
			log.Fatalf("conflist uses %s: %v", Placeholder, err)
		}
	}
	out, err := Render(raw, cidrs)
	if err != nil {
		log.Fatalf("%s: %v", *confSrc, err)
	}
	dst := filepath.Join(*confDst, filepath.Base(*confSrc))
	changed, err := writeAtomic(dst, out, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("conflist %s (changed: %v, pod CIDRs: %s)", dst, changed, strings.Join(cidrs, ","))
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

type counts struct{ total, updated, kept int }

func installBinaries(src, dst string, ifMissing []string) (counts, error) {
	var c counts
	ents, err := os.ReadDir(src)
	if err != nil {
		return c, err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return c, err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if contains(ifMissing, e.Name()) {
			if _, err := os.Stat(filepath.Join(dst, e.Name())); err == nil {
				c.total++
				c.kept++
				continue
			}
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return c, err
		}
		changed, err := writeAtomic(filepath.Join(dst, e.Name()), b, 0o755)
		if err != nil {
			return c, err
		}
		c.total++
		if changed {
			c.updated++
		}
	}
	if c.total == 0 {
		return c, fmt.Errorf("no binaries in %s", src)
	}
	return c, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// writeAtomic writes b to path through a temporary file in the same
// directory and a rename; it does nothing when path already holds b.
func writeAtomic(path string, b []byte, mode os.FileMode) (bool, error) {
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

// Render checks the conflist and replaces placeholder ranges by the pod CIDRs.
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

// nodePodCIDRs reads spec.podCIDRs (or spec.podCIDR) of the node through the
// in-cluster API.
func nodePodCIDRs(node string) ([]string, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if node == "" || host == "" || port == "" {
		return nil, errors.New("no -pod-cidrs given and not in a cluster (need NODE_NAME, KUBERNETES_SERVICE_HOST/PORT)")
	}
	token, err := os.ReadFile(filepath.Join(saDir, "token"))
	if err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	ca, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("service account CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("service account CA: no certificate")
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	url := "https://" + net.JoinHostPort(host, port) + "/api/v1/nodes/" + node
	var lastErr error
	for attempt := 0; attempt < 30; attempt++ {
		if attempt > 0 {
			time.Sleep(2 * time.Second)
		}
		cidrs, err := getPodCIDRs(client, url, strings.TrimSpace(string(token)))
		if err == nil && len(cidrs) > 0 {
			return cidrs, nil
		}
		if err == nil {
			err = fmt.Errorf("node %s has no spec.podCIDRs yet (is the controller manager allocating node CIDRs?)", node)
		}
		lastErr = err
	}
	return nil, lastErr
}

func getPodCIDRs(client *http.Client, url, token string) ([]string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	var node struct {
		Spec struct {
			PodCIDR  string   `json:"podCIDR"`
			PodCIDRs []string `json:"podCIDRs"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(body, &node); err != nil {
		return nil, err
	}
	if len(node.Spec.PodCIDRs) > 0 {
		return node.Spec.PodCIDRs, nil
	}
	if node.Spec.PodCIDR != "" {
		return []string{node.Spec.PodCIDR}, nil
	}
	return nil, nil
}
