package breaker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Set is a Breaker per node of a dependency made of several (a Redis
// Cluster's masters): a failing node opens its own breaker, and calls to
// the others go on. Breakers are made as nodes are first named, all with
// the Set's Options; their metrics carry the node as a label. A node that
// leaves keeps its breaker (a handful of entries over a cluster's life).
type Set struct {
	opts      Options
	mu        sync.Mutex
	m         map[string]*Breaker
	lmu       sync.Mutex // listeners: apart from mu, as a transition runs under its breaker's lock
	listeners []func(node string, from, to State, cause error)
}

// NewSet validates opts and returns an empty Set.
func NewSet(opts Options) (*Set, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("breaker: %w", err)
	}
	return &Set{opts: opts, m: map[string]*Breaker{}}, nil
}

// Node is node's breaker, made closed the first time node is named.
func (s *Set) Node(node string) (*Breaker, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.m[node]; ok {
		return b, nil
	}
	opts := s.opts
	change := opts.OnChange
	opts.OnChange = func(from, to State, cause error) {
		if change != nil {
			change(from, to, cause)
		}
		s.lmu.Lock()
		ls := s.listeners
		s.lmu.Unlock()
		for _, l := range ls {
			l(node, from, to, cause)
		}
	}
	b, err := newBreaker(opts, node)
	if err != nil {
		return nil, err
	}
	s.m[node] = b
	return b, nil
}

// Listen adds f to what every node's transitions are told, after
// Options.OnChange. Like OnChange, f must not call the Set.
func (s *Set) Listen(f func(node string, from, to State, cause error)) {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	s.listeners = append(s.listeners, f)
}

// Do runs f through node's breaker (see Breaker.Do).
func (s *Set) Do(ctx context.Context, node string, f func(ctx context.Context) error) error {
	b, err := s.Node(node)
	if err != nil {
		return err
	}
	return b.Do(ctx, f)
}

// State is the worst state of the nodes in use: Open when one is open,
// HalfOpen when one is probing, Closed when all are (or none was named
// yet). A node no call named for twice OpenFor (a master replaced in a
// failover, which the client no longer routes to) is not in use.
func (s *Set) State() State {
	worst := Closed
	for _, b := range s.breakers() {
		switch b.inUseState() {
		case Open:
			return Open
		case HalfOpen:
			worst = HalfOpen
		}
	}
	return worst
}

// breakers is a copy of the node → breaker map, to read outside mu: a
// transition holds its breaker's lock while it tells the listeners.
func (s *Set) breakers() map[string]*Breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	bs := make(map[string]*Breaker, len(s.m))
	for n, b := range s.m {
		bs[n] = b
	}
	return bs
}

// States is each node's state now (in use or not).
func (s *Set) States() map[string]State {
	bs := s.breakers()
	out := make(map[string]State, len(bs))
	for n, b := range bs {
		out[n] = b.State()
	}
	return out
}

// RetryIn is how long until a call refused with err (an *OpenError) may
// be tried again; ok is false for any other error.
func RetryIn(err error) (d time.Duration, ok bool) {
	var oe *OpenError
	if !errors.As(err, &oe) {
		return 0, false
	}
	return max(time.Until(oe.Until), 0), true
}
