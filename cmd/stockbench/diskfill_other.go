//go:build !linux

package main

import "errors"

// fillDisk needs Linux (the fault mounts a tmpfs).
func fillDisk(string) (func() error, error) {
	return nil, errors.New("the full-disk fault runs on Linux only")
}
