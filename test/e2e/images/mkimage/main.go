// Command mkimage writes a single-layer OCI image layout as a tar archive,
// by hand, so the e2e suite can `ctr images import` its images without any
// registry or image builder:
//
//	mkimage -o httpd.tar -name localhost/ebpf-e2e/httpd:e2e \
//	        -file /httpd=bin/httpd -entrypoint /httpd -env PORT=8080
//
// The archive holds oci-layout, index.json (annotated with the image name
// for containerd) and blobs/sha256/{layer,config,manifest}. Output is
// reproducible: fixed timestamps and owners, files in flag order.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path"
	"runtime"
	"strings"
	"time"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

const (
	mtManifest = "application/vnd.oci.image.manifest.v1+json"
	mtIndex    = "application/vnd.oci.image.index.v1+json"
	mtConfig   = "application/vnd.oci.image.config.v1+json"
	mtLayer    = "application/vnd.oci.image.layer.v1.tar"
)

var epoch = time.Unix(0, 0).UTC()

func digest(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// layer builds an uncompressed tar of the files (dst=src), with parent
// directories, owned by root.
func layer(files []string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok || !path.IsAbs(dst) {
			return nil, fmt.Errorf("-file %q: want /path/in/image=host/path", f)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		rel := strings.TrimPrefix(path.Clean(dst), "/")
		var parents []string
		for d := path.Dir(rel); d != "." && !dirs[d]; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
			dirs[d] = true
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: int64(st.Mode().Perm()), Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	// Mount points the runtime fills in; runc creates them anyway, but an
	// image that has them is friendlier to read-only root filesystems.
	for _, d := range []string{"dev", "etc", "proc", "sys", "tmp"} {
		if !dirs[d] {
			mode := int64(0o755)
			if d == "tmp" {
				mode = 0o1777
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func main() {
	var files, entrypoint, env list
	out := flag.String("o", "", "output tar archive (OCI image layout)")
	name := flag.String("name", "", "image reference, e.g. localhost/ebpf-e2e/httpd:e2e")
	arch := flag.String("arch", runtime.GOARCH, "image architecture")
	flag.Var(&files, "file", "/path/in/image=host/path (repeatable)")
	flag.Var(&entrypoint, "entrypoint", "entrypoint argument (repeatable, in order)")
	flag.Var(&env, "env", "KEY=VALUE (repeatable)")
	flag.Parse()
	if *out == "" || *name == "" || len(files) == 0 || len(entrypoint) == 0 {
		fmt.Fprintln(os.Stderr, "usage: mkimage -o OUT.tar -name REF -file /dst=src [-file ...] -entrypoint /dst [-env K=V]")
		os.Exit(2)
	}
	if err := run(*out, *name, *arch, files, entrypoint, env); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(out, name, arch string, files, entrypoint, env []string) error {
	tag := "latest"
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		tag = name[i+1:]
	}
	lay, err := layer(files)
	if err != nil {
		return err
	}
	if len(env) == 0 {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	cfg, err := json.Marshal(map[string]any{
		"created":      epoch.Format(time.RFC3339),
		"architecture": arch,
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": entrypoint,
			"Env":        env,
			"WorkingDir": "/",
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{digest(lay)}},
		"history": []map[string]string{{"created": epoch.Format(time.RFC3339), "created_by": "ebpf-cni test/e2e/images/mkimage"}},
	})
	if err != nil {
		return err
	}
	man, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mtManifest,
		"config":        descriptor{MediaType: mtConfig, Digest: digest(cfg), Size: int64(len(cfg))},
		"layers":        []descriptor{{MediaType: mtLayer, Digest: digest(lay), Size: int64(len(lay))}},
	})
	if err != nil {
		return err
	}
	idx, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mtIndex,
		"manifests": []descriptor{{
			MediaType: mtManifest, Digest: digest(man), Size: int64(len(man)),
			Annotations: map[string]string{
				"io.containerd.image.name":          name,
				"org.opencontainers.image.ref.name": tag,
			},
			Platform: &platform{Architecture: arch, OS: "linux"},
		}},
	})
	if err != nil {
		return err
	}

	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	add := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	blob := func(b []byte) error { return add("blobs/sha256/"+strings.TrimPrefix(digest(b), "sha256:"), b) }
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	for _, step := range []func() error{
		func() error { return add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)) },
		func() error { return blob(lay) },
		func() error { return blob(cfg) },
		func() error { return blob(man) },
		func() error { return add("index.json", idx) },
		tw.Close,
	} {
		if err := step(); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
