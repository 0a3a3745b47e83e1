package ledger_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/ledger"
)

// docs/RUNBOOK.md's "Rolling back across a schema change" is what an
// operator reads before a rollback: it names every step this build ships
// (number, name, expand or contract), this build's minimum, and the
// command that undoes steps (TestMigrateCommand runs it).
func TestRunbookNamesEverySchemaStep(t *testing.T) {
	b, err := os.ReadFile("../docs/RUNBOOK.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n## Rolling back across a schema change\n")
	if start < 0 {
		t.Fatal(`docs/RUNBOOK.md has no section "## Rolling back across a schema change"`)
	}
	section := doc[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	section = strings.Join(strings.Fields(section), " ") // lines wrap anywhere
	steps, minimum := ledger.Steps()
	for _, s := range steps {
		if want := fmt.Sprintf("%d `%s`", s[0], s[1]); !strings.Contains(section, want) {
			t.Errorf("the rollback section does not name step %s", want)
		}
	}
	for _, want := range []string{fmt.Sprintf("This build's minimum is %d", minimum), "stockgate migrate -schema-down-to", "helm rollback"} {
		if !strings.Contains(section, want) {
			t.Errorf("the rollback section does not say %q", want)
		}
	}
}
