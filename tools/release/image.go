package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's user: no name, no shell, not root. 65532 is the "nonroot" id distroless
// images use, so volume permissions carry over between them.
const imageUser = 65532

// imagePlatform is one architecture of the image and the linux binary for it.
type imagePlatform struct {
	Arch   string
	Binary string
}

// buildImage writes an OCI image index with one image per platform, as a tarball of
// an OCI layout (load it with `skopeo copy oci-archive:…`, `podman load`, or `crane
// push`). Each image is the binary on an empty base: no shell, no package manager,
// nothing else to patch.
func buildImage(m meta, ps []imagePlatform, path string) error {
	var adds []mutate.IndexAddendum
	for _, p := range ps {
		img, err := imageFor(m, p)
		if err != nil {
			return fmt.Errorf("linux/%s: %w", p.Arch, err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: p.Arch},
		}})
	}
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
	dir, err := os.MkdirTemp("", "narad-oci-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }() // a temp dir; the tarball is what counts
	if _, err := layout.Write(dir, idx); err != nil {
		return err
	}
	return tarDir(dir, path)
}

// imageFor is the image of one platform.
func imageFor(m meta, p imagePlatform) (v1.Image, error) {
	bin, err := os.ReadFile(p.Binary)
	if err != nil {
		return nil, err
	}
	layerTar, err := rootfs(bin)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	created, err := time.Parse(time.RFC3339, m.Date)
	if err != nil {
		return nil, fmt.Errorf("date %q: %w", m.Date, err)
	}
	cf.OS, cf.Architecture, cf.Created = "linux", p.Arch, v1.Time{Time: created}
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", imageUser, imageUser),
		Entrypoint: []string{"/narad"},
		// Listening beyond loopback needs security on: set NARAD_ADMIN_PASSWORD.
		Cmd:          []string{"serve", "--http-addr", "0.0.0.0:7942", "--data-dir", "/data"},
		WorkingDir:   "/data",
		Volumes:      map[string]struct{}{"/data": {}},
		ExposedPorts: map[string]struct{}{"7942/tcp": {}},
		StopSignal:   "SIGTERM",
		Labels: map[string]string{
			"org.opencontainers.image.title":    "narad",
			"org.opencontainers.image.version":  m.Version,
			"org.opencontainers.image.revision": m.Commit,
			"org.opencontainers.image.created":  m.Date,
			"org.opencontainers.image.source":   m.Source,
			"org.opencontainers.image.description": "Narad: a durable, queue-first message broker over plain HTTP. " +
				"Health: GET /healthz (process up), GET /readyz (serving); the image has no shell for a HEALTHCHECK command.",
		},
	}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the image's one layer: /narad, and /data owned by the image's user (a
// volume mounted there starts with that owner), and /tmp for `serve --dev`.
func rootfs(bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, h := range []*tar.Header{
		{Name: "data/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: imageUser, Gid: imageUser, ModTime: epoch},
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: epoch},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: "narad", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin)), ModTime: epoch}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir writes the files under dir into a tarball at path, names relative to dir.
func tarDir(dir, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	werr := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name, h.ModTime = filepath.ToSlash(rel), time.Unix(0, 0)
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		if info.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer func() { _ = in.Close() }() // read only
		_, err = io.Copy(tw, in)
		return err
	})
	if werr != nil {
		_ = tw.Close()
		_ = f.Close()
		return werr
	}
	if err := tw.Close(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
