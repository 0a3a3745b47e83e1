package main

import "testing"

// The faults section replaces its own part of the document, wherever it
// is, and a suite run that rewrites the rest keeps it.
func TestReplaceSection(t *testing.T) {
	sec := faultsHeading + "\n\nnew\n"
	for _, c := range []struct{ doc, want string }{
		{"# B\n\n## A\n\na\n", "# B\n\n## A\n\na\n\n" + sec},
		{"# B\n\n" + faultsHeading + "\n\nold\n\n## C\n\nc\n", "# B\n\n" + sec + "\n## C\n\nc\n"},
		{"# B\n\n" + faultsHeading + "\n\nold\n", "# B\n\n" + sec},
	} {
		if got := replaceSection(c.doc, sec); got != c.want {
			t.Errorf("replaceSection(%q) = %q, want %q", c.doc, got, c.want)
		}
	}
	doc := "# B\n\n" + faultsHeading + "\n\nold\n\n## C\n\nc\n"
	if got := sectionOf(doc, faultsHeading); got != faultsHeading+"\n\nold\n" {
		t.Errorf("sectionOf = %q", got)
	}
	if got := replaceSection("# fresh\n", sectionOf(doc, faultsHeading)); got != "# fresh\n\n"+faultsHeading+"\n\nold\n" {
		t.Errorf("a fresh document keeping the section = %q", got)
	}
}
