package main

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

var testMeta = meta{Version: "1.2.3-test", Commit: "0123456789abcdef", Date: "2026-12-01T12:00:00Z", Source: "https://example.invalid/narad"}

// TestImageConfig builds the image from stand-in binaries and inspects what a
// container runtime would read: an index of linux/amd64 and linux/arm64 images, each
// running /narad serve as a non-root user with /data as its volume, the version
// stamped in its labels, and the binary in its only layer.
func TestImageConfig(t *testing.T) {
	dir := t.TempDir()
	var ps []imagePlatform
	for _, arch := range []string{"amd64", "arm64"} {
		bin := filepath.Join(dir, "narad-"+arch)
		if err := os.WriteFile(bin, []byte("stand-in for "+arch), 0o755); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, imagePlatform{Arch: arch, Binary: bin})
	}
	tarPath := filepath.Join(dir, "img.tar")
	if err := buildImage(testMeta, ps, tarPath); err != nil {
		t.Fatal(err)
	}
	oci := filepath.Join(dir, "oci")
	if out, err := exec.Command("tar", "-xf", tarPath, "-C", mkdir(t, oci)).CombinedOutput(); err != nil {
		t.Fatalf("untar: %v %s", err, out)
	}
	p, err := layout.FromPath(oci)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 2 {
		t.Fatalf("the index has %d images, want 2", len(m.Manifests))
	}
	seen := map[string]bool{}
	for _, d := range m.Manifests {
		if d.Platform == nil || d.Platform.OS != "linux" {
			t.Fatalf("image %s has platform %+v", d.Digest, d.Platform)
		}
		seen[d.Platform.Architecture] = true
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		c := cf.Config
		if c.User == "" || strings.HasPrefix(c.User, "0") || strings.HasPrefix(c.User, "root") {
			t.Errorf("%s: user %q, want a non-root numeric user", d.Platform.Architecture, c.User)
		}
		if _, ok := c.Volumes["/data"]; !ok || !contains(c.Cmd, "/data") {
			t.Errorf("%s: volumes %v, cmd %v: want /data as the volume and the data directory", d.Platform.Architecture, c.Volumes, c.Cmd)
		}
		if len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/narad" || len(c.Cmd) == 0 || c.Cmd[0] != "serve" {
			t.Errorf("%s: entrypoint %v cmd %v, want /narad serve", d.Platform.Architecture, c.Entrypoint, c.Cmd)
		}
		if c.Labels["org.opencontainers.image.version"] != testMeta.Version || c.Labels["org.opencontainers.image.revision"] != testMeta.Commit {
			t.Errorf("%s: labels %v lack the version and commit", d.Platform.Architecture, c.Labels)
		}
		if cf.Architecture != d.Platform.Architecture || cf.OS != "linux" {
			t.Errorf("config says %s/%s under the %s entry", cf.OS, cf.Architecture, d.Platform.Architecture)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s: %d layers (%v), want 1", d.Platform.Architecture, len(layers), err)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		files := untarNames(t, rc)
		if files["narad"] != "stand-in for "+d.Platform.Architecture || files["data/"] != "dir 65532" {
			t.Errorf("%s: layer holds %v", d.Platform.Architecture, files)
		}
	}
	if !seen["amd64"] || !seen["arm64"] {
		t.Fatalf("architectures %v, want amd64 and arm64", seen)
	}
}

// TestReleaseForThisMachine builds a release for this machine's platform only and
// checks it: the tarball's binary reports the stamped version, commit and date, the
// checksums file covers every artifact and matches it, and the SBOM names the
// modules linked in.
func TestReleaseForThisMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the broker")
	}
	out := t.TempDir()
	p := platform{runtime.GOOS, runtime.GOARCH}
	if err := release(testMeta, "../../broker", out, []platform{p}); err != nil {
		t.Fatal(err)
	}
	tgz := filepath.Join(out, archiveName(testMeta, p))
	x := mkdir(t, filepath.Join(out, "x"))
	if o, err := exec.Command("tar", "-xzf", tgz, "-C", x).CombinedOutput(); err != nil {
		t.Fatalf("untar: %v %s", err, o)
	}
	v, err := exec.Command(filepath.Join(x, "narad"), "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{testMeta.Version, testMeta.Commit, testMeta.Date} {
		if !strings.Contains(string(v), want) {
			t.Errorf("narad version printed %q, want it to contain %q", v, want)
		}
	}
	sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(out)
	for _, e := range entries {
		if e.IsDir() || e.Name() == "SHA256SUMS" {
			continue
		}
		s, err := sha256File(filepath.Join(out, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(sums), s+"  "+e.Name()+"\n") {
			t.Errorf("SHA256SUMS lacks %s's sum %s:\n%s", e.Name(), s, sums)
		}
	}
	sbom, err := os.ReadFile(tgz + ".sbom.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"bomFormat": "CycloneDX"`, "github.com/narad-mq/narad/broker", "github.com/quic-go/quic-go", "go.etcd.io/bbolt"} {
		if !strings.Contains(string(sbom), want) {
			t.Errorf("the SBOM lacks %q", want)
		}
	}
	if p.OS == "linux" {
		if _, err := os.Stat(filepath.Join(out, "narad_"+testMeta.Version+"_oci.tar")); err != nil {
			t.Errorf("no image for a linux release: %v", err)
		}
	}
	f, err := os.ReadFile(filepath.Join(out, "narad.rb"))
	if err != nil || !strings.Contains(string(f), sumOf(t, out, filepath.Base(tgz))) {
		t.Errorf("the formula does not carry the tarball's checksum: %v\n%s", err, f)
	}
}

func sumOf(t *testing.T, dir, name string) string {
	s, err := sha256File(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mkdir(t *testing.T, d string) string {
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// untarNames maps each entry of a tarball to its content (files) or "dir <uid>".
func untarNames(t *testing.T, r io.Reader) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeDir {
			out[h.Name] = fmt.Sprintf("dir %d", h.Uid)
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = string(b)
	}
}
