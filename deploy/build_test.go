package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// built is the gateway binary the tests of this package share.
var built struct {
	once     sync.Once
	dir, bin string
	out      []byte
	err      error
}

// gatewayBinary is this tree's gateway built once per test process as
// deploy/Dockerfile builds it (CGO_ENABLED=0, -trimpath): three tests run
// it, and each build costs tens of seconds of CPU on a busy make test.
func gatewayBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "stockgate-deploy-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "stockgate")
		cmd := exec.Command("go", "build", "-trimpath", "-o", built.bin, "../cmd/stockgate")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		built.out, built.err = cmd.CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("build: %v\n%s", built.err, built.out)
	}
	return built.bin
}

// removeBuilt removes the shared binary's directory (TestMain, at the end).
func removeBuilt() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}
