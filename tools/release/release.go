// Command release builds stockgate's release artifacts without a
// container daemon: the image for linux/amd64 and linux/arm64 as one OCI
// index (an OCI layout under dist/image, which crane, skopeo or oras push
// to a registry), and the Helm chart packaged with that index's digest as
// its image. Built twice from one commit it gives the same digest: the
// binaries are built with -trimpath and no VCS stamp (the version and
// revision come from flags), every file and config time is the commit's.
//
// It is a module of its own, outside the repository's workspace
// (go-containerregistry is a release tool, not a dependency of the
// server): build and test it with GOWORK=off. `make release` runs it.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Options say what to build and where.
type Options struct {
	Repo      string    // the repository's root (the server module)
	Out       string    // where the artifacts go (dist/)
	Version   string    // stamped into the binary and the image's labels; the chart's appVersion
	Revision  string    // the commit, stamped likewise
	Epoch     time.Time // every time in the image (SOURCE_DATE_EPOCH)
	Platforms []string  // os/arch pairs
	Helm      string    // the helm binary that packages the chart ("": no chart)
	Certs     string    // a CA bundle to put at /etc/ssl/certs/ca-certificates.crt ("": none)
}

// Validate reports the first bad option.
func (o Options) Validate() error {
	switch {
	case o.Repo == "" || o.Out == "":
		return errors.New("release: Repo and Out are required")
	case !regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(o.Version):
		return fmt.Errorf("release: version %q is not vMAJOR.MINOR.PATCH[-PRE]", o.Version)
	case len(o.Platforms) == 0:
		return errors.New("release: no platform")
	}
	for _, p := range o.Platforms {
		if os, arch, ok := strings.Cut(p, "/"); !ok || os != "linux" || arch == "" {
			return fmt.Errorf("release: platform %q is not linux/ARCH", p)
		}
	}
	return nil
}

// Result is what a build made.
type Result struct {
	Digest v1.Hash // the image index's
	Image  string  // the OCI layout's directory
	Chart  string  // the packaged chart ("" when none)
}

// Build makes the artifacts o names.
func Build(ctx context.Context, o Options) (Result, error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	var certs []byte
	if o.Certs != "" {
		var err error
		if certs, err = os.ReadFile(o.Certs); err != nil {
			return Result{}, fmt.Errorf("release: CA bundle: %w", err)
		}
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range o.Platforms {
		_, arch, _ := strings.Cut(p, "/")
		bin, err := buildBinary(ctx, o, arch)
		if err != nil {
			return Result{}, err
		}
		img, err := image(o, arch, bin, certs)
		if err != nil {
			return Result{}, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	digest, err := idx.Digest()
	if err != nil {
		return Result{}, err
	}
	res := Result{Digest: digest, Image: filepath.Join(o.Out, "image")}
	if err := os.RemoveAll(res.Image); err != nil {
		return Result{}, err
	}
	lp, err := layout.Write(res.Image, empty.Index)
	if err != nil {
		return Result{}, fmt.Errorf("release: OCI layout: %w", err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.version": o.Version, "org.opencontainers.image.revision": o.Revision})); err != nil {
		return Result{}, fmt.Errorf("release: OCI layout: %w", err)
	}
	if err := os.WriteFile(filepath.Join(o.Out, "image.digest"), []byte(digest.String()+"\n"), 0o644); err != nil {
		return Result{}, err
	}
	if o.Helm != "" {
		if res.Chart, err = packageChart(ctx, o, digest); err != nil {
			return Result{}, err
		}
	}
	return res, nil
}

// buildBinary builds cmd/stockgate for linux/arch: static, reproducible.
func buildBinary(ctx context.Context, o Options, arch string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "stockgate-release-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "stockgate")
	const pkg = "github.com/stockgate/stockgate/buildinfo"
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", fmt.Sprintf("-s -w -buildid= -X %s.version=%s -X %s.revision=%s", pkg, o.Version, pkg, o.Revision),
		"-o", out, "./cmd/stockgate")
	cmd.Dir = o.Repo
	repo, err := filepath.Abs(o.Repo)
	if err != nil {
		return nil, err
	}
	// The image's workspace, as deploy/Dockerfile's: the server and the
	// client alone (this tool runs with GOWORK=off, outside any).
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch,
		"GOWORK="+filepath.Join(repo, "deploy", "image.work"))
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("release: go build for linux/%s: %w\n%s", arch, err, b)
	}
	return os.ReadFile(out)
}

// image is one platform's image: the binary (and the CA bundle) in one
// layer, run as the distroless nonroot user, as deploy/Dockerfile's.
func image(o Options, arch string, bin, certs []byte) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, mode int64, body []byte) error {
		h := &tar.Header{Name: name, Mode: mode, Size: int64(len(body)), ModTime: o.Epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if body == nil {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	err := add("stockgate", 0o755, bin)
	if err == nil && certs != nil {
		for _, d := range []string{"etc/", "etc/ssl/", "etc/ssl/certs/"} {
			if err = add(d, 0o755, nil); err != nil {
				break
			}
		}
		if err == nil {
			err = add("etc/ssl/certs/ca-certificates.crt", 0o644, certs)
		}
	}
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("release: layer: %w", err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		// Compressed once and kept: without it the layer is gzipped
		// again for every read after the digest (the layout's write),
		// about 40 MB of binary each time.
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("release: layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: o.Epoch}, CreatedBy: "stockgate release"}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, v1.Time{Time: o.Epoch}
	cf.Config = v1.Config{
		// As deploy/Dockerfile: the orchestrator's arguments are the
		// subcommand (the chart's Job runs [migrate]).
		Entrypoint:   []string{"/stockgate"},
		Cmd:          []string{"serve"},
		User:         "65532:65532",
		ExposedPorts: map[string]struct{}{"8080/tcp": {}},
		Labels:       map[string]string{"org.opencontainers.image.version": o.Version, "org.opencontainers.image.revision": o.Revision},
	}
	return mutate.ConfigFile(img, cf)
}

// packageChart packages deploy/helm/stockgate with the index's digest as
// its image and the version as its appVersion.
func packageChart(ctx context.Context, o Options, digest v1.Hash) (string, error) {
	tmp, err := os.MkdirTemp("", "stockgate-chart-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(o.Repo, "deploy", "helm", "stockgate")
	chart := filepath.Join(tmp, "stockgate")
	if err := os.CopyFS(chart, os.DirFS(src)); err != nil {
		return "", fmt.Errorf("release: copy the chart: %w", err)
	}
	values := filepath.Join(chart, "values.yaml")
	v, err := os.ReadFile(values)
	if err != nil {
		return "", err
	}
	const unpinned = "\n  digest: \"\""
	if strings.Count(string(v), unpinned) != 1 {
		return "", errors.New(`release: values.yaml has no one image digest: "" line to pin`)
	}
	v = []byte(strings.Replace(string(v), unpinned, "\n  digest: \""+digest.String()+"\"", 1))
	if err := os.WriteFile(values, v, 0o644); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, o.Helm, "package", chart, "--app-version", o.Version, "--destination", o.Out)
	b, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("release: helm package: %w\n%s", err, b)
	}
	// "Successfully packaged chart and saved it to: PATH"
	_, path, ok := strings.Cut(strings.TrimSpace(string(b)), "saved it to: ")
	if !ok {
		return "", fmt.Errorf("release: helm package said %q", b)
	}
	return path, nil
}
