package ledger_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The life of a ticket is one table in docs/ARCHITECTURE.md: every
// transition names the test that makes it, and that test exists where the
// row says. A transition added without a test, or a test renamed, fails
// here.
func TestLifecycleTableIsTested(t *testing.T) {
	doc, err := os.ReadFile("../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "## The life of a ticket")
	if start < 0 {
		t.Fatal("docs/ARCHITECTURE.md has no section \"The life of a ticket\"")
	}
	section := text[start:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	cell := regexp.MustCompile("`(Test[A-Za-z0-9_]+)` \\(([^)]+_test\\.go)\\)\\s*\\|\\s*$")
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| transition") {
			continue
		}
		rows++
		name := strings.TrimSpace(strings.Split(line, "|")[1])
		m := cell.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("transition %q names no test in its last column", name)
			continue
		}
		src, err := os.ReadFile(filepath.Join("..", m[2]))
		if err != nil {
			t.Errorf("transition %q: %v", name, err)
			continue
		}
		if !strings.Contains(string(src), "func "+m[1]+"(t *testing.T)") {
			t.Errorf("transition %q: %s has no func %s", name, m[2], m[1])
		}
	}
	if rows < 15 {
		t.Errorf("the table has %d transitions; every hold, order, listing and transfer transition belongs in it", rows)
	}
}
