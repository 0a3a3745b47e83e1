package main

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// memLimitShare is the part of the container's memory limit the Go heap
// may grow to before the collector works harder: the rest is stacks,
// buffers and the kernel's accounting, so the pod is not OOM-killed first.
const memLimitShare = 0.9

// setMemoryLimit sets the Go soft memory limit from the cgroup's memory
// limit, unless GOMEMLIMIT says otherwise. Without it the collector only
// looks at GOGC and a burst of buyers can push the heap past the
// container's limit. It returns the limit set, 0 when none.
func setMemoryLimit(cgroupRoot string) int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := cgroupMemoryLimit(cgroupRoot)
	if limit <= 0 {
		return 0
	}
	set := int64(float64(limit) * memLimitShare)
	debug.SetMemoryLimit(set)
	return set
}

// cgroupMemoryLimit reads the memory limit of cgroup v2 (memory.max) or v1
// (memory/memory.limit_in_bytes) under root; 0 when there is none.
func cgroupMemoryLimit(root string) int64 {
	for _, f := range []string{root + "/memory.max", root + "/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		// v1 reports "no limit" as a huge number rounded to the page size.
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0
		}
		return n
	}
	return 0
}
