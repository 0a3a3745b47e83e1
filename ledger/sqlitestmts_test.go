package ledger

import (
	"fmt"
	"path/filepath"
	"testing"
)

// A connection's cached statements: the same text run again with other
// arguments, a query of one text run while its own rows are still open
// (the nested one prepares its own), more texts than the cache holds,
// and the connection closed with statements in it.
func TestSQLiteConnectionKeepsStatements(t *testing.T) {
	ctx := t.Context()
	db := newSQLiteDB("file:" + filepath.Join(t.TempDir(), "s.db"))
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (n INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := db.ExecContext(ctx, `INSERT INTO t (n) VALUES ($1)`, i); err != nil {
			t.Fatal(err)
		}
	}
	const q = `SELECT n FROM t WHERE n >= $1 ORDER BY n`
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.QueryContext(ctx, q, 0)
	if err != nil {
		t.Fatal(err)
	}
	var outer, inner []int
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		outer = append(outer, n)
		var m int
		if err := tx.QueryRowContext(ctx, q, n).Scan(&m); err != nil {
			t.Fatal(err)
		}
		inner = append(inner, m)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(outer) != "[0 1 2 3 4]" || fmt.Sprint(inner) != "[0 1 2 3 4]" {
		t.Fatalf("outer %v, inner %v: want 0..4 each", outer, inner)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for i := range stmtCacheSize + 20 {
		var n int
		if err := db.QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*) + %d FROM t`, i)).Scan(&n); err != nil || n != 5+i {
			t.Fatalf("query %d: %d, %v", i, n, err)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, q, 3).Scan(&n); err != nil || n != 3 {
		t.Fatalf("after the cache filled: %d, %v", n, err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("close with statements cached: %v", err)
	}
}
