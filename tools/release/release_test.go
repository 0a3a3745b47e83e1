package main

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// helm is the helm make deps-helm installs (make test installs it first):
// missing, the test fails, as CI skips nothing.
func helm(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
	if err != nil {
		t.Fatal(err)
	}
	gobin, gopath, _ := strings.Cut(string(out), "\n")
	dir := strings.TrimSpace(gobin)
	if dir == "" {
		dir = filepath.Join(strings.TrimSpace(gopath), "bin")
	}
	h := filepath.Join(dir, "helm")
	if _, err := os.Stat(h); err != nil {
		t.Fatalf("helm: %v (make deps-helm installs it)", err)
	}
	return h
}

// The release as `make release` builds it, and again from the same tree
// into another directory: the same image index both times (so the same
// image for each platform, and the digest the chart pins is the one any
// rebuild gets); the image for this machine's
// architecture runs `/stockgate version` from its own filesystem and
// says the version stamped; its config runs the server as the Dockerfile
// does; the packaged chart renders the image by that digest.
func TestReleaseReproducibleAndRuns(t *testing.T) {
	ctx := context.Background()
	o := Options{Repo: "../..", Version: "v0.0.0-test.1", Revision: "0123456789abcdef", Epoch: time.Unix(1764374400, 0).UTC(),
		Platforms: []string{"linux/amd64", "linux/arm64"}, Helm: helm(t), Certs: "/etc/ssl/certs/ca-certificates.crt"}
	if _, err := os.Stat(o.Certs); err != nil {
		o.Certs = ""
	}
	o.Out = t.TempDir()
	first, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	// Again, both platforms (the compiles come from the build cache: two
	// links are the build's cost): the same index, byte for byte.
	again := o
	again.Out, again.Helm = t.TempDir(), ""
	second, err := Build(ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image index %s", first.Digest)

	lp, err := layout.FromPath(first.Image)
	if err != nil {
		t.Fatal(err)
	}
	root, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	rm, err := root.IndexManifest()
	if err != nil || len(rm.Manifests) != 1 || rm.Manifests[0].Digest != first.Digest {
		t.Fatalf("the layout's index names %+v (%v), want the image index %s", rm, err, first.Digest)
	}
	idx, err := root.ImageIndex(first.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var arches []string
	var mine v1.Image
	for _, d := range im.Manifests {
		arches = append(arches, d.Platform.OS+"/"+d.Platform.Architecture)
		if d.Platform.Architecture == runtime.GOARCH {
			if mine, err = idx.Image(d.Digest); err != nil {
				t.Fatal(err)
			}
		}
	}
	if strings.Join(arches, ",") != "linux/amd64,linux/arm64" {
		t.Errorf("the index has %v, want linux/amd64 and linux/arm64", arches)
	}
	if mine == nil {
		t.Fatalf("no image for %s in %v", runtime.GOARCH, arches)
	}
	if d, err := mine.Digest(); err != nil || d != platformImage(t, second, runtime.GOARCH) {
		t.Errorf("two builds of one tree: linux/%s images %s and %s, want one digest", runtime.GOARCH, d, platformImage(t, second, runtime.GOARCH))
	}
	if second.Digest != first.Digest {
		t.Errorf("two builds of one tree: image indexes %s and %s, want one digest", first.Digest, second.Digest)
	}
	// dist/image.digest, what a publishing step pushes and checks by.
	if got, err := os.ReadFile(filepath.Join(o.Out, "image.digest")); err != nil || strings.TrimSpace(string(got)) != first.Digest.String() {
		t.Errorf("image.digest = %q (%v), want the index's %s", got, err, first.Digest)
	}
	cf, err := mine.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if c := cf.Config; strings.Join(c.Entrypoint, " ") != "/stockgate" || strings.Join(c.Cmd, " ") != "serve" || c.User != "65532:65532" {
		t.Errorf("image config %+v, want /stockgate serve as 65532:65532", c)
	}

	// The image's filesystem, unpacked, runs.
	fsDir := t.TempDir()
	rc := mutate.Extract(mine)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(fsDir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, os.FileMode(h.Mode))
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(filepath.Join(fsDir, "stockgate"), "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), o.Version) || !strings.Contains(string(out), o.Revision) {
		t.Errorf("/stockgate version from the image = %q (%v), want %s and %s", out, err, o.Version, o.Revision)
	}

	// The chart runs exactly that image.
	if first.Chart == "" {
		t.Fatal("no chart packaged")
	}
	rendered, err := exec.Command(o.Helm, "template", "sg", first.Chart, "--kube-version", "1.34.0", "--set", "existingSecret=sg").CombinedOutput()
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", first.Chart, err, rendered)
	}
	if want := "image: ghcr.io/stockgate/stockgate@" + first.Digest.String(); !strings.Contains(string(rendered), want) {
		t.Errorf("the packaged chart does not render %q", want)
	}
}

// platformImage is the digest of arch's image in r's index.
func platformImage(t *testing.T, r Result, arch string) v1.Hash {
	t.Helper()
	lp, err := layout.FromPath(r.Image)
	if err != nil {
		t.Fatal(err)
	}
	root, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := root.ImageIndex(r.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		if d.Platform != nil && d.Platform.Architecture == arch {
			return d.Digest
		}
	}
	t.Fatalf("no %s image in %s", arch, r.Image)
	return v1.Hash{}
}
