package clienttest_test

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// client/README.md shows every capability of the client: its Go blocks,
// read in order, are one function's body that compiles against the client
// module as it is, and every exported function and every method of its
// Client is called in them.
func TestReadmeCompiles(t *testing.T) {
	readme, err := os.ReadFile("../../client/README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) < 5 {
		t.Fatalf("client/README.md has %d Go blocks", len(blocks))
	}
	var body strings.Builder
	for _, b := range blocks {
		body.WriteString(b[1])
	}

	// Every exported name of the package, called in the blocks.
	fset := gotoken.NewFileSet()
	files, err := filepath.Glob("../../client/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || !fn.Name.IsExported() {
				continue
			}
			if fn.Recv != nil {
				// Methods of the Client (a Problem's Error and Options'
				// Validate are not capabilities).
				recv := fn.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				if id, ok := recv.(*ast.Ident); !ok || id.Name != "Client" {
					continue
				}
			}
			names = append(names, fn.Name.Name)
		}
	}
	if len(names) < 50 {
		t.Fatalf("found %d exported functions and methods in client/: the parse went wrong", len(names))
	}
	for _, n := range names {
		if !regexp.MustCompile(`\.` + n + `\(`).MatchString(body.String()) {
			t.Errorf("client/README.md never calls %s", n)
		}
	}

	// The blocks as a program of their own, built against the module.
	clientDir, err := filepath.Abs("../../client")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mod := "module tour\n\ngo 1.26\n\nrequire github.com/stockgate/stockgate/client v0.0.0\n\n" +
		"replace github.com/stockgate/stockgate/client => " + clientDir + "\n"
	src := "package main\n\nimport (\n\t\"context\"\n\t\"errors\"\n\t\"fmt\"\n\t\"os\"\n\t\"time\"\n\n" +
		"\t\"github.com/stockgate/stockgate/client\"\n)\n\n" +
		"func tour(ctx context.Context) error {\n" + body.String() + "}\n\nfunc main() { _ = tour }\n"
	for name, text := range map[string]string{"go.mod": mod, "main.go": src} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "vet", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("client/README.md's Go blocks do not build as one function:\n%s\n%s", out, src)
	}
}
