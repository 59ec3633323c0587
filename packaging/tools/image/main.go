// Command image writes vipd's container image as an OCI image layout packed
// in a tar archive (an "oci-archive"), reproducibly: the same binaries and
// SOURCE_DATE_EPOCH give the same bytes, so the same commit gives the same
// digest on any machine.
//
// The image holds vipd, vipd-controllers and the CA certificates of the
// Mozilla (NSS) trust store, taken from golang.org/x/crypto/x509roots (pinned
// in this module's go.sum, not the build host's), and nothing else: no shell,
// no libc. It is assembled with go-containerregistry.
//
//	go -C packaging/tools run ./image -vipd bin/vipd -controllers bin/vipd-controllers \
//	    -version 1.2.3 -commit <sha> -tag ghcr.io/vipd/vipd:1.2.3 -out dist/vipd-1.2.3.oci.tar
//
// make image runs it through packaging/image.sh.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// Paths inside the image; vipd looks for vipd-controllers in /usr/lib/vipd.
const (
	vipdPath        = "/usr/bin/vipd"
	controllersPath = "/usr/lib/vipd/vipd-controllers"
	caPath          = "/etc/ssl/certs/ca-certificates.crt"
	stateDir        = "/var/lib/vipd"
)

type options struct {
	vipd, controllers string
	version, commit   string
	tags              []string
	arch              string
	epoch             int64
	out               string
}

func main() {
	var o options
	var tags string
	flag.StringVar(&o.vipd, "vipd", "", "the vipd binary (linux, static)")
	flag.StringVar(&o.controllers, "controllers", "", "the vipd-controllers binary")
	flag.StringVar(&o.version, "version", "", "vipd's version (image label)")
	flag.StringVar(&o.commit, "commit", "", "the commit the binaries were built from (image label)")
	flag.StringVar(&tags, "tag", "", "image references to record in the archive, comma-separated (repo:tag)")
	flag.StringVar(&o.arch, "arch", "amd64", "GOARCH of the binaries")
	flag.StringVar(&o.out, "out", "", "the OCI archive to write")
	flag.Parse()
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	var err error
	if o.epoch, err = strconv.ParseInt(epoch, 10, 64); err != nil || o.epoch < 0 {
		fmt.Fprintf(os.Stderr, "image: SOURCE_DATE_EPOCH=%q: want seconds since 1970 (the commit time: git log -1 --format=%%ct)\n", epoch)
		os.Exit(2)
	}
	for _, t := range strings.Split(tags, ",") {
		if t = strings.TrimSpace(t); t != "" {
			o.tags = append(o.tags, t)
		}
	}
	if o.vipd == "" || o.controllers == "" || o.version == "" || o.out == "" || len(o.tags) == 0 {
		fmt.Fprintln(os.Stderr, "image: -vipd, -controllers, -version, -tag and -out are required")
		os.Exit(2)
	}
	digest, err := build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s %s\n", o.out, digest, strings.Join(o.tags, ","))
}

// build writes the archive and returns the image manifest's digest.
func build(o options) (v1.Hash, error) {
	mtime := time.Unix(o.epoch, 0).UTC()
	layerTar, err := rootfs(o, mtime)
	if err != nil {
		return v1.Hash{}, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("layer: %w", err)
	}
	created := v1.Time{Time: mtime}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer, History: v1.History{
		Created: created, CreatedBy: "packaging/tools/image: vipd, vipd-controllers, CA certificates",
	}})
	if err != nil {
		return v1.Hash{}, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	cf = cf.DeepCopy()
	cf.Created = created
	cf.OS, cf.Architecture = "linux", o.arch
	labels := map[string]string{
		"org.opencontainers.image.title":    "vipd",
		"org.opencontainers.image.source":   "https://github.com/vipd/vipd",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.created":  mtime.Format(time.RFC3339),
	}
	if o.commit != "" {
		labels["org.opencontainers.image.revision"] = o.commit
	}
	cf.Config = v1.Config{
		// `vipd manifest static-pod` sets args [run] and no command.
		Entrypoint: []string{vipdPath},
		Cmd:        []string{"run"},
		Env:        []string{"PATH=/usr/bin", "SSL_CERT_FILE=" + caPath},
		WorkingDir: "/",
		Labels:     labels,
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return v1.Hash{}, err
	}
	annotated, ok := mutate.Annotations(img, labels).(v1.Image)
	if !ok {
		return v1.Hash{}, errors.New("annotations: not an image")
	}
	img = annotated
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}

	dir, err := os.MkdirTemp("", "vipd-image-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("layout: %w", err)
	}
	for _, tag := range o.tags {
		// containerd (ctr images import, docker load) reads the first
		// annotation, podman load and skopeo the OCI one.
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
			"io.containerd.image.name":          tag,
			"org.opencontainers.image.ref.name": tag,
		})); err != nil {
			return v1.Hash{}, fmt.Errorf("layout: %w", err)
		}
	}
	if err := writeArchive(dir, o.out, mtime); err != nil {
		return v1.Hash{}, err
	}
	return digest, nil
}

// rootfs returns the image's only layer: a tar with fixed owners, modes and
// times, entries in a fixed order.
func rootfs(o options, mtime time.Time) ([]byte, error) {
	vipd, err := os.ReadFile(o.vipd)
	if err != nil {
		return nil, err
	}
	ctrl, err := os.ReadFile(o.controllers)
	if err != nil {
		return nil, err
	}
	var ca bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		// A root with a constraint (distrust after a date) cannot be
		// expressed in a PEM bundle: leave it out rather than trust it
		// more than the store does.
		if r.Constraint != nil {
			continue
		}
		if err := pem.Encode(&ca, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
		n++
	}
	if n < 50 {
		return nil, fmt.Errorf("only %d CA certificates in x509roots/fallback/bundle", n)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	dirs := []struct {
		name string
		mode int64
	}{
		{"etc/", 0o755}, {"etc/ssl/", 0o755}, {"etc/ssl/certs/", 0o755},
		{"usr/", 0o755}, {"usr/bin/", 0o755}, {"usr/lib/", 0o755}, {"usr/lib/vipd/", 0o755},
		// The mount point of the state volume.
		{"var/", 0o755}, {"var/lib/", 0o755}, {strings.TrimPrefix(stateDir, "/") + "/", 0o750},
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{
		{caPath, 0o644, ca.Bytes()},
		{vipdPath, 0o755, vipd},
		{controllersPath, 0o755, ctrl},
	} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.name, "/"), Mode: f.mode,
			Size: int64(len(f.data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// writeArchive packs the layout directory into out: sorted names, owner
// root, the given time, no other metadata.
func writeArchive(dir, out string, mtime time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != dir {
			names = append(names, path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	for _, path := range names {
		st, err := os.Lstat(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		rel = filepath.ToSlash(rel)
		h := &tar.Header{Name: rel, ModTime: mtime, Mode: 0o644, Format: tar.FormatPAX}
		switch {
		case st.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, rel+"/", 0o755
		case st.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, st.Size()
		default:
			return fmt.Errorf("%s: unexpected file type in the layout", path)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
