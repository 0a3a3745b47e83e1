package ledger

import "golang.org/x/sys/unix"

// diskFree is the bytes an unprivileged writer may still use on the file
// system holding dir; false when it cannot tell. Free blocks count in
// fragment-size units (Frsize); a file system that reports no blocks at
// all (some FUSE mounts) tells nothing.
func diskFree(dir string) (int64, bool) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil || fs.Blocks == 0 {
		return 0, false
	}
	return int64(fs.Bavail) * int64(fs.Frsize), true //nolint:unconvert // Frsize is int32 on 32-bit Linux
}
