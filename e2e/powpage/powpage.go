// Package powpage takes a place in a waiting room that asks for proof of
// work the way a buyer's browser does: the room's own page in headless
// Chromium solves the puzzle in its web worker. The browser can run on a
// slowed CPU to stand for a phone, so a phone-class solve time is
// measured, not extrapolated. The browser test and stockbench's suite both
// use it.
//
// DevTools' CPU throttling (Emulation.setCPUThrottlingRate, what
// Lighthouse's mobile runs use) slows only a page's main thread: the
// worker tried 520,857 hashes a second slowed 4 times and 677,412 unslowed.
// So the slowed browser runs in a CPU cgroup of its own, allowed a
// quarter of one core (as WebPageTest's agents throttle with cgroups),
// which slows every thread of it, the worker's too.
package powpage

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/chromedp/chromedp"
)

// PhoneSlowdown is how many times slower than this machine's core the
// slowed browser runs: Lighthouse's factor for a mid-range phone.
const PhoneSlowdown = 4

// Solve is one puzzle solved by the page.
type Solve struct {
	Took  time.Duration // the worker's own time
	Tries int64         // hashes tried
}

// Rate is the hashes tried per second.
func (s Solve) Rate() float64 { return float64(s.Tries) / max(s.Took.Seconds(), 1e-9) }

// Expected is how long the page takes on average for a puzzle of bits
// (2^bits tries) at this solve's rate: one solve's tries vary by their
// nature, the rate does not.
func (s Solve) Expected(bits int) time.Duration {
	return time.Duration(float64(uint64(1)<<bits) / s.Rate() * float64(time.Second))
}

// Browser starts headless Chromium at chrome, on slowdown times less CPU
// than one core when slowdown is above 1 (Linux, as root). Run Join on the
// context it returns (or on one derived from it, with a timeout); stop
// ends the browser and removes what it made.
func Browser(ctx context.Context, chrome string, slowdown float64) (bctx context.Context, stop func(), err error) {
	if slowdown < 1 {
		return nil, nil, errors.New("powpage: slowdown below 1")
	}
	exe, undo := chrome, func() {}
	if slowdown > 1 {
		if exe, undo, err = slowed(chrome, slowdown); err != nil {
			return nil, nil, err
		}
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Headless, chromedp.WindowSize(900, 640))...)
	bctx, cancel := chromedp.NewContext(alloc)
	stop = func() { cancel(); cancelAlloc(); undo() }
	// Started here, on the caller's context: the browser lives as long as
	// the context of its first run, so a timeout on a later Join's must
	// not be the first.
	if err := chromedp.Do(bctx); err != nil {
		stop()
		return nil, nil, fmt.Errorf("powpage: start the browser: %w", err)
	}
	return bctx, stop, nil
}

var made atomic.Int64

// slowed makes a CPU cgroup allowed 1/slowdown of one core and a script
// that starts chrome in it (its every process inherits the cgroup).
func slowed(chrome string, slowdown float64) (exe string, undo func(), err error) {
	const period = 10000 // µs: short, so the slowed worker runs in small slices
	quota := int(period / slowdown)
	name := fmt.Sprintf("stockgate-powpage-%d-%d", os.Getpid(), made.Add(1))
	var dir string
	switch {
	case exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"): // cgroup v1
		dir = filepath.Join("/sys/fs/cgroup/cpu", name)
		err = mkCgroup(dir, map[string]string{"cpu.cfs_period_us": strconv.Itoa(period), "cpu.cfs_quota_us": strconv.Itoa(quota)})
	case exists("/sys/fs/cgroup/cgroup.controllers"): // cgroup v2
		if err = os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+cpu"), 0); err == nil {
			dir = filepath.Join("/sys/fs/cgroup", name)
			err = mkCgroup(dir, map[string]string{"cpu.max": fmt.Sprintf("%d %d", quota, period)})
		}
	default:
		err = errors.New("no cgroup CPU controller mounted")
	}
	if err != nil {
		return "", nil, fmt.Errorf("powpage: a slowed CPU for the browser (run as root on Linux): %w", err)
	}
	tmp, err := os.MkdirTemp("", "powpage")
	if err != nil {
		os.Remove(dir)
		return "", nil, err
	}
	exe = filepath.Join(tmp, "chromium")
	script := fmt.Sprintf("#!/bin/sh\necho $$ > %s || exit 1\nexec %s \"$@\"\n", shellQuote(filepath.Join(dir, "cgroup.procs")), shellQuote(chrome))
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		os.RemoveAll(tmp)
		os.Remove(dir)
		return "", nil, err
	}
	return exe, func() {
		os.RemoveAll(tmp)
		// The browser's processes leave the cgroup as they exit; it can
		// be removed once the last has.
		for range 50 {
			if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}, nil
}

func mkCgroup(dir string, settings map[string]string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	for file, v := range settings {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0); err != nil {
			os.Remove(dir)
			return err
		}
	}
	return nil
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Join opens the queue page of program at base as buyer, in the browser
// of ctx (from Browser), and waits until the page has taken its place
// (waiting or admitted). It fails if the page took its place without
// solving a puzzle.
func Join(ctx context.Context, base, program, buyer string) (Solve, error) {
	err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/queue/"+url.PathEscape(program)+"?buyer="+url.QueryEscape(buyer)),
		chromedp.WaitVisible(chromedp.CSS(`main[data-state="waiting"], main[data-state="admitted"]`)),
	)
	if err != nil {
		state, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`main`)))
		return Solve{}, fmt.Errorf("powpage: the page of %s: %w (it shows %q)", program, err, state)
	}
	ms, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(`body`), "data-pow-ms"))
	if err != nil {
		return Solve{}, err
	}
	tries, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(`body`), "data-pow-tries"))
	if err != nil {
		return Solve{}, err
	}
	if !ms.Exists || !tries.Exists {
		return Solve{}, errors.New("powpage: the page took its place without solving a puzzle")
	}
	m, err1 := strconv.ParseFloat(ms.Value, 64)
	n, err2 := strconv.ParseInt(tries.Value, 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return Solve{}, fmt.Errorf("powpage: the page's solve: %w", err)
	}
	return Solve{Took: time.Duration(m * float64(time.Millisecond)), Tries: n}, nil
}
