package ledger

import (
	"context"
	"database/sql"
)

// SchemaDigest is the digest the builds from before versioned migrations
// look for in ledger_schema.
var SchemaDigest = schemaDigest

// LatestStep is this build's newest schema step.
var LatestStep = thisBuild.latest()

// FutureStep is a migration a later build would ship, for the tests of
// rollouts and rollbacks across schema changes: SQL run in its transaction.
type FutureStep struct {
	Version     int64
	OldestBuild int64 // > 0: a contract step
	Up, Down    string
}

// OpenBuild opens the ledger as a build whose migrations are this build's
// followed by steps, and whose code runs on schemas from minimum up.
func OpenBuild(ctx context.Context, opts Options, minimum int64, steps ...FutureStep) (*Ledger, error) {
	b := schemaSteps{steps: append([]migration(nil), thisBuild.steps...), minimum: minimum}
	for _, s := range steps {
		m := migration{version: s.Version, name: "future", oldestBuild: s.OldestBuild,
			up: func(_ *Ledger, ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, s.Up)
				return err
			}}
		if s.Down != "" {
			m.down = func(_ *Ledger, ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, s.Down)
				return err
			}
		}
		b.steps = append(b.steps, m)
	}
	return open(ctx, opts, b)
}

// Steps are this build's schema steps as (version, name), and its minimum.
func Steps() (steps [][2]any, minimum int64) {
	for _, m := range thisBuild.steps {
		steps = append(steps, [2]any{m.version, m.name})
	}
	return steps, thisBuild.minimum
}

// CommitRefused is commitRefused, for its table test.
var CommitRefused = commitRefused
