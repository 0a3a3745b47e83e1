package main

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestMemoryLimitFromCgroup(t *testing.T) {
	write := func(t *testing.T, name, content string) string {
		t.Helper()
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return root
	}
	for _, c := range []struct {
		name, file, content string
		want                int64
	}{
		{"v2 limit", "memory.max", "536870912\n", 536870912},
		{"v2 none", "memory.max", "max\n", 0},
		{"v1 limit", "memory/memory.limit_in_bytes", "268435456\n", 268435456},
		{"v1 none", "memory/memory.limit_in_bytes", "9223372036854771712\n", 0},
		{"garbage", "memory.max", "lots", 0},
	} {
		if got := cgroupMemoryLimit(write(t, c.file, c.content)); got != c.want {
			t.Errorf("%s: limit %d, want %d", c.name, got, c.want)
		}
	}
	if got := cgroupMemoryLimit(t.TempDir()); got != 0 {
		t.Errorf("no cgroup files: %d, want 0", got)
	}

	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	t.Setenv("GOMEMLIMIT", "")
	root := write(t, "memory.max", "536870912\n")
	if set := setMemoryLimit(root); set != 483183820 || debug.SetMemoryLimit(-1) != set {
		t.Errorf("set %d (runtime %d), want 90 %% of 512 MiB", set, debug.SetMemoryLimit(-1))
	}
	t.Setenv("GOMEMLIMIT", "100MiB")
	if set := setMemoryLimit(root); set != 0 {
		t.Errorf("with GOMEMLIMIT set, setMemoryLimit set %d; want it left alone", set)
	}
}
