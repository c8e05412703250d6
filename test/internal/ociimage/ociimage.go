// Package ociimage writes a single-layer OCI image layout as a tar archive,
// by hand, so test suites can `ctr images import` images without any
// registry or image builder. The archive holds oci-layout, index.json
// (annotated with the image name for containerd) and
// blobs/sha256/{layer,config,manifest}. Output is reproducible: fixed
// timestamps and owners, entries in the order they were added.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

const (
	mtManifest = "application/vnd.oci.image.manifest.v1+json"
	mtIndex    = "application/vnd.oci.image.index.v1+json"
	mtConfig   = "application/vnd.oci.image.config.v1+json"
	mtLayer    = "application/vnd.oci.image.layer.v1.tar"
)

var epoch = time.Unix(0, 0).UTC()

// Image is what goes into one archive.
type Image struct {
	Name       string   // reference, e.g. registry.k8s.io/pause:3.10.1
	Arch       string   // GOARCH
	Entrypoint []string // required
	Cmd        []string
	Env        []string // default: a PATH
	User       string

	buf  bytes.Buffer
	tw   *tar.Writer
	seen map[string]bool // paths already in the layer
}

// New starts an image.
func New(name, arch string) *Image {
	im := &Image{Name: name, Arch: arch, seen: map[string]bool{}}
	im.tw = tar.NewWriter(&im.buf)
	return im
}

func rel(dst string) (string, error) {
	if !path.IsAbs(dst) {
		return "", fmt.Errorf("image path %q is not absolute", dst)
	}
	r := strings.TrimPrefix(path.Clean(dst), "/")
	if r == "" {
		return "", fmt.Errorf("image path %q names the root", dst)
	}
	return r, nil
}

// parents writes the missing parent directories of r.
func (im *Image) parents(r string) error {
	var ds []string
	for d := path.Dir(r); d != "." && !im.seen[d]; d = path.Dir(d) {
		ds = append([]string{d}, ds...)
	}
	for _, d := range ds {
		if err := im.Dir("/"+d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

func (im *Image) header(h *tar.Header) error {
	r := strings.TrimSuffix(h.Name, "/")
	if im.seen[r] {
		if h.Typeflag == tar.TypeDir {
			return nil // directories repeat when trees overlap
		}
		return fmt.Errorf("%s is in the image twice", "/"+r)
	}
	if err := im.parents(r); err != nil {
		return err
	}
	im.seen[r] = true
	h.ModTime, h.Format = epoch, tar.FormatPAX
	return im.tw.WriteHeader(h)
}

// Dir adds a directory.
func (im *Image) Dir(dst string, mode fs.FileMode) error {
	r, err := rel(dst)
	if err != nil {
		return err
	}
	m := int64(mode.Perm())
	if mode&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return im.header(&tar.Header{Typeflag: tar.TypeDir, Name: r + "/", Mode: m})
}

// Bytes adds a regular file with the given content.
func (im *Image) Bytes(dst string, data []byte, mode fs.FileMode) error {
	r, err := rel(dst)
	if err != nil {
		return err
	}
	if err := im.header(&tar.Header{Typeflag: tar.TypeReg, Name: r, Mode: int64(mode.Perm()), Size: int64(len(data))}); err != nil {
		return err
	}
	_, err = im.tw.Write(data)
	return err
}

// File adds the host file src at dst, with its permission bits.
func (im *Image) File(dst, src string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return im.Bytes(dst, data, st.Mode())
}

// Symlink adds a symbolic link dst -> target.
func (im *Image) Symlink(dst, target string) error {
	r, err := rel(dst)
	if err != nil {
		return err
	}
	return im.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: r, Linkname: target, Mode: 0o777})
}

// Tree adds every directory, regular file and symlink under the host
// directory src at dst, in lexical order. Other file types are refused.
func (im *Image) Tree(dst, src string) error {
	var paths []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != src {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	for _, p := range paths {
		r, _ := filepath.Rel(src, p)
		to := path.Join(dst, filepath.ToSlash(r))
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case st.Mode().IsDir():
			err = im.Dir(to, st.Mode())
		case st.Mode().IsRegular():
			err = im.File(to, p)
		case st.Mode()&fs.ModeSymlink != 0:
			var t string
			if t, err = os.Readlink(p); err == nil {
				err = im.Symlink(to, t)
			}
		default:
			err = fmt.Errorf("%s: unsupported file type %v", p, st.Mode().Type())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func digest(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

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

// Write finishes the layer and writes the archive to out (through a
// temporary file and a rename, so a cache never holds half an image).
func (im *Image) Write(out string) error {
	if im.Name == "" || len(im.Entrypoint) == 0 {
		return fmt.Errorf("image %s: a name and an entrypoint are required", out)
	}
	// Mount points the runtime fills in; runc creates them anyway, but an
	// image that has them is friendlier to read-only root filesystems.
	for _, d := range []string{"dev", "etc", "proc", "sys", "tmp"} {
		if !im.seen[d] {
			mode := fs.FileMode(0o755)
			if d == "tmp" {
				mode = 0o777 | fs.ModeSticky
			}
			if err := im.Dir("/"+d, mode); err != nil {
				return err
			}
		}
	}
	if err := im.tw.Close(); err != nil {
		return err
	}
	lay := im.buf.Bytes()
	tag := "latest"
	if i := strings.LastIndex(im.Name, ":"); i > strings.LastIndex(im.Name, "/") {
		tag = im.Name[i+1:]
	}
	env := im.Env
	if len(env) == 0 {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	conf := map[string]any{"Entrypoint": im.Entrypoint, "Env": env, "WorkingDir": "/"}
	if len(im.Cmd) > 0 {
		conf["Cmd"] = im.Cmd
	}
	if im.User != "" {
		conf["User"] = im.User
	}
	cfg, err := json.Marshal(map[string]any{
		"created":      epoch.Format(time.RFC3339),
		"architecture": im.Arch,
		"os":           "linux",
		"config":       conf,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{digest(lay)}},
		"history":      []map[string]string{{"created": epoch.Format(time.RFC3339), "created_by": "ebpf-cni test/internal/ociimage"}},
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
				"io.containerd.image.name":          im.Name,
				"org.opencontainers.image.ref.name": tag,
			},
			Platform: &platform{Architecture: im.Arch, OS: "linux"},
		}},
	})
	if err != nil {
		return err
	}

	tmp := out + ".tmp"
	f, err := os.Create(tmp)
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
	steps := []func() error{}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		steps = append(steps, func() error {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch})
		})
	}
	steps = append(steps,
		func() error { return add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)) },
		func() error { return blob(lay) },
		func() error { return blob(cfg) },
		func() error { return blob(man) },
		func() error { return add("index.json", idx) },
		tw.Close,
		f.Close,
	)
	for _, step := range steps {
		if err := step(); err != nil {
			f.Close()
			os.Remove(tmp)
			return err
		}
	}
	return os.Rename(tmp, out)
}
