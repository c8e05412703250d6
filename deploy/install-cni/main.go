// Command install-cni is the init container of the ebpf-cni DaemonSet
// (deploy/ebpf-cni.yaml): it copies the CNI binaries shipped in the image to
// the node's CNI bin directory and, outside Kubernetes, writes a conflist to
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
// Conflist: -conf-src "" installs none: in Kubernetes the agent writes it
// (ebpf-agent run --cni-conf-template) from the node's Node object and keeps
// it current. Otherwise an IPAM range whose subnet is "__PODCIDR__" is
// replaced by one range set per CIDR of -pod-cidrs ($POD_CIDRS; IPv4 and
// IPv6 for dual stack); a conflist without the placeholder is installed as
// it is.
//
// Standard library only and static, so the image can be FROM scratch.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

func main() {
	binSrc := flag.String("bin-src", "/opt/ebpf-cni/cni-bin", "directory of CNI binaries in the image")
	binDst := flag.String("bin-dst", "/host/opt/cni/bin", "node CNI bin directory (hostPath)")
	ifMissing := flag.String("if-missing", "host-local,loopback", "binaries installed only when the node has none of that name")
	confSrc := flag.String("conf-src", "/etc/ebpf-cni/10-ebpf-cni.conflist", "conflist (ConfigMap); empty: install none (the agent writes it)")
	confDst := flag.String("conf-dst", "/host/etc/cni/net.d", "node CNI conf directory (hostPath)")
	podCIDRs := flag.String("pod-cidrs", os.Getenv("POD_CIDRS"), "comma-separated pod CIDRs of this node, for a conflist whose ranges say "+conflist.Placeholder)
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("install-cni: ")

	n, err := installBinaries(*binSrc, *binDst, splitList(*ifMissing))
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("%d binaries in %s (%d updated, %d kept as the node had them)", n.total, *binDst, n.updated, n.kept)
	if *confSrc == "" {
		log.Printf("no conflist to install (-conf-src \"\"): the agent writes it")
		return
	}
	raw, err := os.ReadFile(*confSrc)
	if err != nil {
		log.Fatal(err)
	}
	cidrs := splitList(*podCIDRs)
	out, err := conflist.Render(raw, cidrs)
	if err != nil {
		if conflist.UsesPlaceholder(raw) && len(cidrs) == 0 {
			err = fmt.Errorf("%w (give -pod-cidrs, or let ebpf-agent run --cni-conf-template render it from the Node object)", err)
		}
		log.Fatalf("%s: %v", *confSrc, err)
	}
	dst := filepath.Join(*confDst, filepath.Base(*confSrc))
	changed, err := conflist.WriteAtomic(dst, out, 0o644)
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
		changed, err := conflist.WriteAtomic(filepath.Join(dst, e.Name()), b, 0o755)
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
