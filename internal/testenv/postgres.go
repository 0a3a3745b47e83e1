package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// DatabaseURLEnv names an existing PostgreSQL server to use instead of
// starting one. The role in it must be allowed to CREATE DATABASE.
const DatabaseURLEnv = "STOCKGATE_TEST_DATABASE_URL"

// Postgres is a PostgreSQL server the tests may create databases on.
type Postgres struct {
	adminURL string
	cmd      *exec.Cmd // nil when the server was given by DatabaseURLEnv
	done     chan struct{}
	dir      string
	// The migrated template (NewDatabaseFrom), made on first use.
	tmplMu   sync.Mutex
	tmpl     string
	dropTmpl func()
	// What Restart starts again (a server this package started).
	bin  string
	args []string
	cred *syscall.Credential
}

// StartPostgres returns the server named by STOCKGATE_TEST_DATABASE_URL or,
// without it, starts a throwaway server from the installed binaries in a
// temp directory (as the postgres user when running as root, since initdb
// refuses root).
func StartPostgres(ctx context.Context) (*Postgres, error) {
	return startPostgres(ctx, false)
}

// StartDurablePostgres is StartPostgres with PostgreSQL's default, durable
// settings (fsync, synchronous commit): what the benchmark measures against.
func StartDurablePostgres(ctx context.Context) (*Postgres, error) {
	return startPostgres(ctx, true)
}

func startPostgres(ctx context.Context, durable bool) (*Postgres, error) {
	if u := os.Getenv(DatabaseURLEnv); u != "" {
		return &Postgres{adminURL: u}, nil
	}
	return startOwnPostgres(ctx, durable)
}

// StartOwnPostgres starts a throwaway server of the test's own, even when
// STOCKGATE_TEST_DATABASE_URL names one: a server the test may Halt and
// Restart.
func StartOwnPostgres(ctx context.Context) (*Postgres, error) { return startOwnPostgres(ctx, false) }

func startOwnPostgres(ctx context.Context, durable bool) (*Postgres, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "stockgate-pg-")
	if err != nil {
		return nil, err
	}
	p := &Postgres{dir: dir, done: make(chan struct{})}
	cred, err := pgCredential(dir)
	if err != nil {
		p.Stop()
		return nil, err
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		p.Stop()
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	for range 10 {
		port, err := freeClusterPort()
		if err != nil {
			p.Stop()
			return nil, err
		}
		// Durability is off for tests: these servers hold test data for
		// seconds. The benchmark asks for the default, durable settings.
		args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1",
			"-c", "max_connections=300"}
		if !durable {
			args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
		} else {
			// The benchmark reads what each statement cost from
			// pg_stat_statements (CREATE EXTENSION in the database it reads).
			args = append(args, "-c", "shared_preload_libraries=pg_stat_statements")
		}
		p.bin, p.args, p.cred = bin, args, cred
		if err := p.run(); err != nil {
			p.Stop()
			return nil, err
		}
		p.adminURL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
		if err := p.waitUp(ctx); err == nil {
			return p, nil
		}
		p.kill()
	}
	err = fmt.Errorf("postgres did not start: %s", tail(filepath.Join(dir, "postgres.log")))
	p.Stop()
	return nil, err
}

// run starts the server process with p's arguments.
func (p *Postgres) run() error {
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), p.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	log, err := os.OpenFile(filepath.Join(p.dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if p.cred != nil {
		_ = log.Chown(int(p.cred.Uid), int(p.cred.Gid))
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); log.Close(); close(done) }() // ends with the process
	p.cmd, p.done = cmd, done
	return nil
}

// Pid is the server's (the postmaster's) process id, the parent of its
// backends; 0 for a server this package did not start.
func (p *Postgres) Pid() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Halt stops a server this package started and keeps its files: a primary
// gone mid-sale. Restart brings it back.
func (p *Postgres) Halt() { p.kill() }

// Restart starts a halted server again on its port, with its data.
func (p *Postgres) Restart(ctx context.Context) error {
	if p.bin == "" {
		return errors.New("testenv: restart: not a server this package started")
	}
	if err := p.run(); err != nil {
		return err
	}
	return p.waitUp(ctx)
}

func (p *Postgres) waitUp(ctx context.Context) error {
	db, err := sql.Open("pgx", p.adminURL)
	if err != nil {
		return err
	}
	defer db.Close()
	return retry(ctx, 15*time.Second, func() error {
		select {
		case <-p.done:
			return errors.New("postgres exited")
		default:
		}
		return db.PingContext(ctx)
	})
}

// NewDatabase creates a fresh, empty database and returns its URL. The
// database is dropped by the returned function.
func (p *Postgres) NewDatabase(ctx context.Context) (string, func(), error) {
	return p.newDatabase(ctx, "")
}

// newDatabase creates a database, a copy of tmpl when it is named.
func (p *Postgres) newDatabase(ctx context.Context, tmpl string) (string, func(), error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "stockgate_test_" + hex.EncodeToString(b[:])
	admin, err := sql.Open("pgx", p.adminURL)
	if err != nil {
		return "", nil, err
	}
	create := func() error { _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); return err }
	if tmpl != "" {
		create = func() error { return copyFromTemplate(ctx, admin, name, tmpl) }
	}
	if err := create(); err != nil {
		admin.Close()
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	u, err := url.Parse(p.adminURL)
	if err != nil {
		admin.Close()
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		admin.Close()
	}
	return u.String(), drop, nil
}

// Stop stops a server this package started (by its pid) and removes its
// files. A server named by the environment is left alone.
func (p *Postgres) Stop() {
	if p.dropTmpl != nil && p.cmd == nil {
		p.dropTmpl() // a server the tests were given keeps no template
	}
	p.kill()
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
	}
}

func (p *Postgres) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.cmd = nil
}

// postgresBin finds the newest installed PostgreSQL server binaries.
func postgresBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres) not found: run `make test` (it installs postgresql with apt-get), or set " + DatabaseURLEnv)
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// pgCredential returns the user the server runs as: the postgres user when
// we are root (initdb refuses root), otherwise ourselves. dir is handed to it.
func pgCredential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a postgres user to run PostgreSQL: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
