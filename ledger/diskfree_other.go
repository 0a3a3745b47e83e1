//go:build !linux

package ledger

// diskFree cannot tell outside Linux (the release's platforms are
// Linux): statfs(2)'s fields differ by system, and a developer's SQLite
// file on a full disk is refused by SQLite itself, 503 (ErrReadOnly is
// then only not said by /readyz ahead of it).
func diskFree(string) (int64, bool) { return 0, false }
