package clienttest

import (
	"os"
	"regexp"
	"testing"

	"golang.org/x/mod/modfile"
)

// TestClientVersionIsTheChangelogs: the client version every module of
// the repository requires (and go.work and the image's workspace point
// at the checkout) is the newest one client/CHANGELOG.md describes, so a
// change to the client's API can't ship without its entry and a new
// version, and the tag to make (client/vX.Y.Z, docs/OPERATIONS.md) is
// that entry's.
func TestClientVersionIsTheChangelogs(t *testing.T) {
	log, err := os.ReadFile("../../client/CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	newest := regexp.MustCompile(`(?m)^## (v\d+\.\d+\.\d+)$`).FindSubmatch(log)
	if newest == nil {
		t.Fatal("client/CHANGELOG.md has no '## vX.Y.Z' entry")
	}
	want := string(newest[1])
	const client = "github.com/stockgate/stockgate/client"
	for _, f := range []string{"../../go.mod", "../../e2e/go.mod", "../../deploy/go.mod", "../../cmd/stockbench/go.mod"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m, err := modfile.ParseLax(f, raw, nil)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range m.Require {
			if r.Mod.Path == client {
				found = true
				if r.Mod.Version != want {
					t.Errorf("%s requires the client at %s, want %s, the newest in client/CHANGELOG.md", f, r.Mod.Version, want)
				}
			}
		}
		if !found && f == "../../go.mod" {
			t.Errorf("%s does not require the client", f)
		}
	}
	for _, f := range []string{"../../go.work", "../../deploy/image.work"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		w, err := modfile.ParseWork(f, raw, nil)
		if err != nil {
			t.Fatal(err)
		}
		replaced := false
		for _, r := range w.Replace {
			if r.Old.Path == client {
				replaced = true
				if r.Old.Version != want {
					t.Errorf("%s replaces the client at %s, want %s", f, r.Old.Version, want)
				}
			}
		}
		if !replaced {
			t.Errorf("%s does not point the client at the checkout", f)
		}
	}
}
