package main

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// fillDisk fills the file system at dir but for 128 KiB with a file of
// its own, a MiB at a time, and returns what removes it.
func fillDisk(dir string) (free func() error, err error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return nil, err
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		return nil, err
	}
	chunk := make([]byte, 1<<20)
	left := int64(fs.Bavail)*int64(fs.Frsize) - 128<<10 //nolint:unconvert // Frsize is int32 on 32-bit Linux
	for left > 0 && err == nil {
		var n int
		n, err = f.Write(chunk[:min(left, int64(len(chunk)))])
		left -= int64(n)
	}
	// ENOSPC is the goal reached early: the ledger grew since the statfs.
	if cerr := f.Close(); cerr != nil && !errors.Is(cerr, syscall.ENOSPC) {
		return nil, cerr
	}
	if err != nil && !errors.Is(err, syscall.ENOSPC) {
		return nil, err
	}
	return func() error { return os.Remove(filler) }, nil
}
