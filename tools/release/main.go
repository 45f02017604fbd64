// Command narad-release builds a release of Narad into one directory: static binaries
// for linux and darwin on amd64 and arm64 (version, commit and date stamped), their
// tarballs, a CycloneDX SBOM per binary, SHA-256 checksums, an OCI image (a tarball of
// an OCI layout with a linux/amd64 and a linux/arm64 image) built without a container
// daemon, and a Homebrew formula for the darwin and linux tarballs.
//
// `make release` runs it; docs/operating/releases.md says what comes out and how it
// is checked.
package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// platform is one build target.
type platform struct{ OS, Arch string }

func (p platform) String() string { return p.OS + "/" + p.Arch }

// platforms are the release's targets.
var platforms = []platform{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}}

// meta stamps a release.
type meta struct {
	Version, Commit, Date string
	// Source is the project's URL, for the image's labels and the formula.
	Source string
}

func main() {
	var m meta
	var out, broker, only string
	flag.StringVar(&m.Version, "version", "", "the release's version, e.g. 0.9.0 (required)")
	flag.StringVar(&m.Commit, "commit", "", "the commit it is built from (required)")
	flag.StringVar(&m.Date, "date", "", "the build date, RFC 3339 (default: the commit's date is the caller's to pass; now)")
	flag.StringVar(&m.Source, "source", "https://github.com/narad-mq/narad", "the project's URL")
	flag.StringVar(&out, "out", "dist", "the directory to write the release into (emptied first)")
	flag.StringVar(&broker, "broker", "broker", "the broker module's directory")
	flag.StringVar(&only, "platforms", "", "comma-separated os/arch to build (default: all four)")
	flag.Parse()
	if m.Version == "" || m.Commit == "" {
		fmt.Fprintln(os.Stderr, "narad-release: -version and -commit are required")
		os.Exit(2)
	}
	if m.Date == "" {
		m.Date = time.Now().UTC().Format(time.RFC3339)
	}
	ps := platforms
	if only != "" {
		ps = nil
		for _, s := range strings.Split(only, ",") {
			osName, arch, ok := strings.Cut(strings.TrimSpace(s), "/")
			if !ok {
				fmt.Fprintf(os.Stderr, "narad-release: platform %q is not os/arch\n", s)
				os.Exit(2)
			}
			ps = append(ps, platform{osName, arch})
		}
	}
	if err := release(m, broker, out, ps); err != nil {
		fmt.Fprintln(os.Stderr, "narad-release:", err)
		os.Exit(1)
	}
}

func release(m meta, broker, out string, ps []platform) error {
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	broker, err := filepath.Abs(broker)
	if err != nil {
		return err
	}
	sbomTool, err := buildSBOMTool(out)
	if err != nil {
		return fmt.Errorf("building cyclonedx-gomod: %w", err)
	}
	binaries := map[platform]string{}
	for _, p := range ps {
		bin, err := buildBinary(m, broker, out, p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		binaries[p] = bin
		tgz := filepath.Join(out, archiveName(m, p))
		if err := tarGz(tgz, bin, "narad"); err != nil {
			return err
		}
		if err := sbom(sbomTool, broker, filepath.Join(out, archiveName(m, p)+".sbom.json"), p); err != nil {
			return fmt.Errorf("SBOM for %s: %w", p, err)
		}
		fmt.Println("built", tgz)
	}
	var linux []imagePlatform
	for _, p := range ps {
		if p.OS == "linux" {
			linux = append(linux, imagePlatform{Arch: p.Arch, Binary: binaries[p]})
		}
	}
	if len(linux) > 0 {
		img := filepath.Join(out, "narad_"+m.Version+"_oci.tar")
		if err := buildImage(m, linux, img); err != nil {
			return fmt.Errorf("image: %w", err)
		}
		fmt.Println("built", img)
	}
	// The formula carries the tarballs' sums; SHA256SUMS then covers it too.
	sums, err := writeChecksums(out)
	if err != nil {
		return err
	}
	formula, err := homebrewFormula(m, sums)
	if err != nil {
		return err
	}
	if formula != "" {
		if err := os.WriteFile(filepath.Join(out, "narad.rb"), []byte(formula), 0o644); err != nil {
			return err
		}
		if _, err := writeChecksums(out); err != nil {
			return err
		}
	}
	// The unpacked binaries were only the inputs of the tarballs and the image.
	return os.RemoveAll(filepath.Join(out, "bin"))
}

func archiveName(m meta, p platform) string {
	return fmt.Sprintf("narad_%s_%s_%s.tar.gz", m.Version, p.OS, p.Arch)
}

// ldflags stamps the version, commit and date into main's variables, and strips the
// symbol table and DWARF (a release binary is not debugged in place).
func ldflags(m meta) string {
	return fmt.Sprintf("-s -w -X main.version=%s -X main.commit=%s -X main.date=%s", m.Version, m.Commit, m.Date)
}

// buildBinary builds a static narad for p (no cgo, trimmed paths: the same source
// gives the same binary on any machine).
func buildBinary(m meta, broker, out string, p platform) (string, error) {
	bin := filepath.Join(out, "bin", p.OS+"_"+p.Arch, "narad")
	abs, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags(m), "-o", abs, "./cmd/narad")
	cmd.Dir = broker
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Arch, "GOWORK=off")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build: %w", err)
	}
	return abs, nil
}

// buildSBOMTool builds this module's cyclonedx-gomod for the machine it runs on (the
// SBOMs are made for other platforms through its environment, so `go tool` with a
// target GOARCH would build it for the target).
func buildSBOMTool(out string) (string, error) {
	abs, err := filepath.Abs(filepath.Join(out, "bin", "cyclonedx-gomod"))
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", abs, "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return abs, cmd.Run()
}

// sbom writes a CycloneDX SBOM (JSON) of the narad binary for p: the modules linked
// into it, with the build's constraints, made by cyclonedx-gomod (this module's tool).
func sbom(tool, broker, path string, p platform) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	cmd := exec.Command(tool, "app", "-json", "-output", abs, "-main", "cmd/narad", broker)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Arch, "GOWORK=off")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: %s", err, stderr.String())
	}
	return nil
}

// tarGz writes a gzipped tarball holding file src as name (mode 0755).
func tarGz(path, src, name string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	err = addFile(tw, src, name)
	err = errors.Join(err, tw.Close(), gz.Close(), f.Close())
	return err
}

func addFile(tw *tar.Writer, src, name string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }() // read only
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: st.Size(), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err = io.Copy(tw, in)
	return err
}

// writeChecksums writes SHA256SUMS over every file in out (sha256sum's format) and
// returns the sums by file name.
func writeChecksums(out string) (map[string]string, error) {
	entries, err := os.ReadDir(out)
	if err != nil {
		return nil, err
	}
	sums := map[string]string{}
	var names []string
	for _, e := range entries {
		if e.IsDir() || e.Name() == "SHA256SUMS" {
			continue
		}
		s, err := sha256File(filepath.Join(out, e.Name()))
		if err != nil {
			return nil, err
		}
		sums[e.Name()] = s
		names = append(names, e.Name())
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s  %s\n", sums[n], n)
	}
	return sums, os.WriteFile(filepath.Join(out, "SHA256SUMS"), []byte(b.String()), 0o644)
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }() // read only
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
