package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// PgBouncer is a throwaway PgBouncer in transaction pooling mode, the mode
// a deployment with many gateway pods runs it in: a server connection
// belongs to a client only for one transaction, so nothing a client leaves
// on a session (prepared statements, SET, session advisory locks) is there
// for its next transaction.
type PgBouncer struct {
	cmd  *exec.Cmd
	done chan struct{}
	dir  string
}

// PgBouncerOptions configure StartPgBouncer.
type PgBouncerOptions struct {
	// PoolSize is the server connections per database and user; clients
	// beyond it wait their turn, as they would in production. Default 4.
	PoolSize int
}

// StartPgBouncer starts PgBouncer in front of the PostgreSQL server that
// target (a postgres:// URL) names and returns target's URL rewritten to go
// through it. It runs as the postgres user when we are root (PgBouncer
// refuses root).
func StartPgBouncer(ctx context.Context, target string, opts PgBouncerOptions) (*PgBouncer, string, error) {
	if opts.PoolSize == 0 {
		opts.PoolSize = 4
	}
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer" // Debian's path, outside a user's PATH
		if _, err := os.Stat(bin); err != nil {
			return nil, "", errors.New("pgbouncer not found: run `make test` (it installs pgbouncer with apt-get)")
		}
	}
	u, err := url.Parse(target)
	if err != nil {
		return nil, "", fmt.Errorf("pgbouncer target: %w", err)
	}
	dir, err := os.MkdirTemp("", "stockgate-pgbouncer-")
	if err != nil {
		return nil, "", err
	}
	b := &PgBouncer{dir: dir, done: make(chan struct{})}
	cred, err := pgCredential(dir)
	if err != nil {
		b.Stop()
		return nil, "", err
	}
	user := u.User.Username()
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), fmt.Appendf(nil, "%q \"\"\n", user), 0o644); err != nil {
		b.Stop()
		return nil, "", err
	}
	for range 10 {
		port, err := freeClusterPort()
		if err != nil {
			b.Stop()
			return nil, "", err
		}
		// trust: the throwaway server trusts loopback too. The user must
		// still be listed in auth_file.
		ini := fmt.Sprintf(`[databases]
* = host=%s port=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits
logfile = %s
`, u.Hostname(), u.Port(), port, filepath.Join(dir, "userlist.txt"), opts.PoolSize, filepath.Join(dir, "pgbouncer.log"))
		conf := filepath.Join(dir, "pgbouncer.ini")
		if err := os.WriteFile(conf, []byte(ini), 0o644); err != nil {
			b.Stop()
			return nil, "", err
		}
		cmd := exec.Command(bin, conf)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			b.Stop()
			return nil, "", fmt.Errorf("start pgbouncer: %w", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }() // ends with the process
		b.cmd, b.done = cmd, done
		bounced := *u
		bounced.Host = "127.0.0.1:" + strconv.Itoa(port)
		if err := b.waitUp(ctx, bounced.String()); err == nil {
			return b, bounced.String(), nil
		}
		b.kill()
	}
	err = fmt.Errorf("pgbouncer did not start: %s", tail(filepath.Join(dir, "pgbouncer.log")))
	b.Stop()
	return nil, "", err
}

func (b *PgBouncer) waitUp(ctx context.Context, dsn string) error {
	// The simple protocol: the probe itself must not depend on what the
	// pooler does with prepared statements.
	db, err := sql.Open("pgx", withParam(dsn, "default_query_exec_mode", "simple_protocol"))
	if err != nil {
		return err
	}
	defer db.Close()
	return retry(ctx, 15*time.Second, func() error {
		select {
		case <-b.done:
			return errors.New("pgbouncer exited")
		default:
		}
		return db.PingContext(ctx)
	})
}

func withParam(dsn, k, v string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// Stop stops the PgBouncer this package started (by its pid) and removes
// its files.
func (b *PgBouncer) Stop() {
	b.kill()
	_ = os.RemoveAll(b.dir)
}

func (b *PgBouncer) kill() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM) // immediate shutdown; SIGINT would wait for clients
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
	b.cmd = nil
}
