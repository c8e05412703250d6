package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/test/internal/ociimage"
)

// The shell tools the sig-network specs exec in agnhost and jessie-dnsutils
// containers: /bin/sh -c with nc -u -w, curl, wget, dig, getent, hostname,
// coreutils. busybox's nc has no -u and Debian's busybox-static sh runs its
// own applets before $PATH, so real dash, netcat-openbsd and curl.
var toolPackages = []string{
	"dash", "bash", "coreutils", "netcat-openbsd", "curl", "wget", "iproute2", "iputils-ping",
	"bind9-dnsutils", "grep", "sed", "mawk", "findutils", "procps", "libc-bin", "hostname", "base-passwd",
	"conntrack", "iptables", // distroless-iptables: conntrack -L in a hostNetwork pod
}

// Packages never unpacked into an image: maintainer-script machinery the
// dependency graph drags in and no spec runs (they would also pull perl).
var skipPackages = map[string]bool{
	"debconf": true, "cdebconf": true, "dpkg": true, "install-info": true, "init-system-helpers": true,
	"usrmerge": true, "usr-is-merged": true, "perl": true, "perl-base": true, "perl-modules-5.36": true,
	"libperl5.36": true, "debianutils": true,
}

// links that maintainer scripts (alternatives, diversions) would create.
var rootfsLinks = map[string]string{
	"/bin/sh":      "dash",
	"/usr/bin/awk": "mawk",
	"/bin/nc":      "nc.openbsd",
	// iptables-nft, Debian's default backend and this machine's.
	"/usr/sbin/iptables":          "iptables-nft",
	"/usr/sbin/iptables-save":     "iptables-nft-save",
	"/usr/sbin/iptables-restore":  "iptables-nft-restore",
	"/usr/sbin/ip6tables":         "ip6tables-nft",
	"/usr/sbin/ip6tables-save":    "ip6tables-nft-save",
	"/usr/sbin/ip6tables-restore": "ip6tables-nft-restore",
}

func buildImages(ctx context.Context, o options, a *artifacts) error {
	dir := filepath.Join(o.cache, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	arch := runtime.GOARCH
	root, err := debianRootfs(ctx, o.cache, toolPackages)
	if err != nil {
		return fmt.Errorf("Debian root filesystem: %w", err)
	}
	specs := []struct {
		file string
		make func(out string) error
	}{
		{"pause.tar", func(out string) error {
			im := ociimage.New(pauseImage, arch)
			im.Entrypoint = []string{"/pause"}
			if err := im.File("/pause", a.path("pause")); err != nil {
				return err
			}
			return im.Write(out)
		}},
		{"agnhost.tar", func(out string) error {
			im := ociimage.New(agnhostImage, arch)
			im.Entrypoint, im.Cmd = []string{"/agnhost"}, []string{"pause"}
			if err := im.Tree("/", root); err != nil {
				return err
			}
			for _, s := range []func() error{
				func() error { return im.File("/agnhost", a.path("agnhost")) },
				func() error { return im.Symlink("/agnhost-2", "agnhost") },
				// Upstream's image carries a CoreDNS (1.6.2) as /coredns: the
				// DNS specs with a custom resolv.conf run it as their server.
				func() error { return im.File("/coredns", a.path("coredns")) },
				func() error { return im.Dir("/uploads", 0o755) },
				// porter's TLS ports serve the certificate shipped beside it.
				func() error {
					return im.File("/localhost.crt", filepath.Join(a.k8sSrc, "test/images/agnhost/porter/localhost.crt"))
				},
				func() error {
					return im.File("/localhost.key", filepath.Join(a.k8sSrc, "test/images/agnhost/porter/localhost.key"))
				},
			} {
				if err := s(); err != nil {
					return err
				}
			}
			return im.Write(out)
		}},
		{"jessie-dnsutils.tar", func(out string) error {
			// dig and the shell tools; the DNS specs' probe pods run sh -c scripts.
			im := ociimage.New(dnsutilsImage, arch)
			im.Entrypoint = []string{"/bin/sh"}
			if err := im.Tree("/", root); err != nil {
				return err
			}
			return im.Write(out)
		}},
		{"distroless-iptables.tar", func(out string) error {
			im := ociimage.New(iptablesImage, arch)
			im.Entrypoint = []string{"/bin/sh"}
			if err := im.Tree("/", root); err != nil {
				return err
			}
			return im.Write(out)
		}},
		{"regression-issue-74839.tar", func(out string) error {
			// The conntrack invalid-state spec's server (raw sockets).
			im := ociimage.New(regressionImage, arch)
			im.Entrypoint = []string{"/regression-issue-74839"}
			if err := im.File("/regression-issue-74839", a.path("regression-issue-74839")); err != nil {
				return err
			}
			return im.Write(out)
		}},
		{"busybox.tar", func(out string) error {
			// The specs run busybox as a plain shell (sh -c, sleep, wget, nc).
			im := ociimage.New(busyboxImage, arch)
			im.Entrypoint, im.Cmd = []string{"/bin/sh"}, []string{}
			if err := im.Tree("/", root); err != nil {
				return err
			}
			return im.Write(out)
		}},
		{"coredns.tar", func(out string) error {
			im := ociimage.New(corednsImage, arch)
			im.Entrypoint = []string{"/coredns"}
			if err := im.File("/coredns", a.path("coredns")); err != nil {
				return err
			}
			return im.Write(out)
		}},
		{"ebpf-cni.tar", func(out string) error {
			// deploy/Dockerfile's layout.
			im := ociimage.New(ebpfCNIImage, arch)
			im.Entrypoint, im.Cmd = []string{"/usr/local/bin/ebpf-agent"}, []string{"run"}
			for dst, src := range map[string]string{
				"/usr/local/bin/ebpf-agent":        a.path("ebpf-agent"),
				"/usr/local/bin/install-cni":       a.path("install-cni"),
				"/opt/ebpf-cni/cni-bin/ebpf-cni":   a.path("ebpf-cni"),
				"/opt/ebpf-cni/cni-bin/host-local": a.path("host-local"),
				"/opt/ebpf-cni/cni-bin/loopback":   a.path("loopback"),
			} {
				if err := im.File(dst, src); err != nil {
					return err
				}
			}
			return im.Write(out)
		}},
	}
	for _, s := range specs {
		out := filepath.Join(dir, s.file)
		if err := s.make(out); err != nil {
			return fmt.Errorf("%s: %w", s.file, err)
		}
		a.images = append(a.images, out)
	}
	return nil
}

// debianRootfs unpacks pkgs and their dependencies (first alternative of
// each, no recommends, skipPackages left out) from `apt-get download` into a
// directory kept in the cache, keyed by the resolved package versions. No
// maintainer script runs and nothing is installed on this machine.
func debianRootfs(ctx context.Context, cache string, pkgs []string) (string, error) {
	all, err := resolveDeps(ctx, pkgs)
	if err != nil {
		return "", err
	}
	// Key: name=candidate version of every package.
	out, err := exec.CommandContext(ctx, "apt-cache", append([]string{"policy"}, all...)...).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache policy: %w", err)
	}
	var vers []byte
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, " ") {
			vers = append(vers, l...)
		} else if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Candidate: "); ok {
			vers = append(vers, v+"\n"...)
		}
	}
	sum := sha256.Sum256(vers)
	root := filepath.Join(cache, "rootfs-"+hex.EncodeToString(sum[:6]))
	err = cached(ctx, root, fmt.Sprintf("Debian root filesystem (%d packages)", len(all)), func(tmp string) error {
		debs := filepath.Join(cache, "debs")
		if err := os.MkdirAll(debs, 0o755); err != nil {
			return err
		}
		dl := exec.CommandContext(ctx, "apt-get", append([]string{"download", "-q"}, all...)...)
		dl.Dir = debs
		if out, err := dl.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get download: %w\n%s", err, tail(string(out), 20))
		}
		for _, p := range all {
			matches, _ := filepath.Glob(filepath.Join(debs, p+"_*.deb"))
			if len(matches) == 0 {
				return fmt.Errorf("no .deb for %s in %s", p, debs)
			}
			sort.Strings(matches)
			deb := matches[len(matches)-1]
			if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, tmp).CombinedOutput(); err != nil {
				return fmt.Errorf("dpkg-deb -x %s: %w: %s", deb, err, out)
			}
		}
		for link, target := range rootfsLinks {
			p := filepath.Join(tmp, link)
			if _, err := os.Lstat(p); err == nil {
				continue
			}
			if err := os.Symlink(target, p); err != nil {
				return err
			}
		}
		// Accounts (base-passwd's masters; postinst would copy them) plus
		// the user and group agnhost's image defines.
		pw, err := os.ReadFile(filepath.Join(tmp, "usr/share/base-passwd/passwd.master"))
		if err != nil {
			return err
		}
		gr, err := os.ReadFile(filepath.Join(tmp, "usr/share/base-passwd/group.master"))
		if err != nil {
			return err
		}
		pw = append(pw, "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"...)
		gr = append(gr, "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"...)
		files := map[string][]byte{
			"etc/passwd":        pw,
			"etc/group":         gr,
			"etc/nsswitch.conf": []byte("passwd: files\ngroup: files\nhosts: files dns\nservices: files\nprotocols: files\n"),
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
				return err
			}
		}
		// Docs and manuals are most of the bytes and no spec reads them.
		for _, d := range []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian"} {
			os.RemoveAll(filepath.Join(tmp, d))
		}
		// The loader's cache, so libraries in multiarch dirs are found fast.
		if out, err := exec.CommandContext(ctx, "ldconfig", "-r", tmp).CombinedOutput(); err != nil {
			return fmt.Errorf("ldconfig -r: %w: %s", err, out)
		}
		return nil
	})
	return root, err
}

// resolveDeps walks Depends and Pre-Depends from pkgs, first alternative
// only, skipping virtual packages and skipPackages.
func resolveDeps(ctx context.Context, pkgs []string) ([]string, error) {
	seen := map[string]bool{}
	queue := append([]string{}, pkgs...)
	for len(queue) > 0 {
		var batch []string
		for _, p := range queue {
			if !seen[p] && !skipPackages[p] {
				seen[p] = true
				batch = append(batch, p)
			}
		}
		queue = nil
		if len(batch) == 0 {
			break
		}
		args := append([]string{"depends", "--no-recommends", "--no-suggests", "--no-conflicts",
			"--no-breaks", "--no-replaces", "--no-enhances"}, batch...)
		out, err := exec.CommandContext(ctx, "apt-cache", args...).Output()
		if err != nil {
			return nil, fmt.Errorf("apt-cache depends: %w (run apt-get update?)", err)
		}
		queue = parseDepends(out)
	}
	var all []string
	for p := range seen {
		all = append(all, p)
	}
	sort.Strings(all)
	return all, nil
}

// parseDepends reads `apt-cache depends` output: the Depends and
// PreDepends of each package, first alternative only (a line starting with
// "|" says the next line is its alternative), no virtual "<name>".
func parseDepends(out []byte) []string {
	var deps []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	altOfPrevious := false
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, " ") {
			altOfPrevious = false
			continue
		}
		t := strings.TrimSpace(l)
		isAlt := strings.HasPrefix(t, "|")
		t = strings.TrimPrefix(t, "|")
		kind, name, ok := strings.Cut(t, ": ")
		if !ok || (kind != "Depends" && kind != "PreDepends") {
			altOfPrevious = false
			continue
		}
		if !altOfPrevious && !strings.HasPrefix(name, "<") {
			deps = append(deps, strings.TrimSuffix(name, ":any"))
		}
		altOfPrevious = isAlt
	}
	return deps
}
