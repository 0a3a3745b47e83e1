package sale

import (
	"sync"
	"time"
)

// logEvery lets one log line of a kind through each second and counts the
// rest: a ledger that fails every commit writes a line a second saying
// how many it left out, not one per request.
type logEvery struct {
	mu   sync.Mutex
	last map[string]time.Time // when a line of the kind last went through
	left map[string]int       // lines of the kind left out since
}

// allow reports whether a line of kind goes through at now, and how many
// of that kind were left out before it.
func (l *logEvery) allow(kind string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.left = map[string]time.Time{}, map[string]int{}
	}
	if at, ok := l.last[kind]; ok && now.Sub(at) < time.Second {
		l.left[kind]++
		return false, 0
	}
	n := l.left[kind]
	l.last[kind], l.left[kind] = now, 0
	return true, n
}
