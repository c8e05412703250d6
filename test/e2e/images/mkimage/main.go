// Command mkimage writes a single-layer OCI image layout as a tar archive
// (test/internal/ociimage), so the e2e suites can `ctr images import` their
// images without any registry or image builder:
//
//	mkimage -o httpd.tar -name localhost/ebpf-e2e/httpd:e2e \
//	        -file /httpd=bin/httpd -entrypoint /httpd -env PORT=8080
//
// -dir /dst=hostdir adds a whole tree (directories, files, symlinks) and
// -symlink /dst=target a link. Output is reproducible: fixed timestamps and
// owners, entries in flag order (-file, then -dir, then -symlink).
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/test/internal/ociimage"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var files, dirs, links, entrypoint, env list
	out := flag.String("o", "", "output tar archive (OCI image layout)")
	name := flag.String("name", "", "image reference, e.g. localhost/ebpf-e2e/httpd:e2e")
	arch := flag.String("arch", runtime.GOARCH, "image architecture")
	flag.Var(&files, "file", "/path/in/image=host/path (repeatable)")
	flag.Var(&dirs, "dir", "/path/in/image=host/directory (repeatable)")
	flag.Var(&links, "symlink", "/path/in/image=target (repeatable)")
	flag.Var(&entrypoint, "entrypoint", "entrypoint argument (repeatable, in order)")
	flag.Var(&env, "env", "KEY=VALUE (repeatable)")
	flag.Parse()
	if *out == "" || *name == "" || len(files)+len(dirs) == 0 || len(entrypoint) == 0 {
		fmt.Fprintln(os.Stderr, "usage: mkimage -o OUT.tar -name REF -file /dst=src [-file ...] [-dir /dst=srcdir] [-symlink /dst=target] -entrypoint /dst [-env K=V]")
		os.Exit(2)
	}
	if err := run(*out, *name, *arch, files, dirs, links, entrypoint, env); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(out, name, arch string, files, dirs, links, entrypoint, env []string) error {
	im := ociimage.New(name, arch)
	im.Entrypoint, im.Env = entrypoint, env
	for _, set := range []struct {
		flag string
		vals []string
		add  func(dst, src string) error
	}{{"-file", files, im.File}, {"-dir", dirs, im.Tree}, {"-symlink", links, im.Symlink}} {
		for _, v := range set.vals {
			dst, src, ok := strings.Cut(v, "=")
			if !ok {
				return fmt.Errorf("%s %q: want /path/in/image=value", set.flag, v)
			}
			if err := set.add(dst, src); err != nil {
				return fmt.Errorf("%s %q: %w", set.flag, v, err)
			}
		}
	}
	return im.Write(out)
}
