package testenv

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ReplyDropper is a dialer for the Redis client that can lose replies: armed
// with a byte pattern and a count, it lets the next commands containing the
// pattern reach the server and run, then throws their replies away and breaks
// the connection, as a network that failed after the server answered.
type ReplyDropper struct {
	mu      sync.Mutex
	match   []byte
	left    int
	dropped atomic.Int64
}

// Arm makes the next n commands whose bytes contain match lose their reply.
func (d *ReplyDropper) Arm(match string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.match, d.left = []byte(match), n
}

// Dropped counts the replies thrown away so far.
func (d *ReplyDropper) Dropped() int64 { return d.dropped.Load() }

func (d *ReplyDropper) take(b []byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.left == 0 || !bytes.Contains(b, d.match) {
		return false
	}
	d.left--
	return true
}

// Dial is the function to give the client as its Dialer.
func (d *ReplyDropper) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialWrapped(ctx, network, addr, func(c net.Conn) net.Conn { return &dropConn{Conn: c, d: d} })
}

// dialWrapped dials addr and hands back the connection wrapped.
func dialWrapped(ctx context.Context, network, addr string, wrap func(net.Conn) net.Conn) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return wrap(c), nil
}

type dropConn struct {
	net.Conn
	d    *ReplyDropper
	drop atomic.Bool
}

func (c *dropConn) Write(b []byte) (int, error) {
	if c.d.take(b) {
		c.drop.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *dropConn) Read(b []byte) (int, error) {
	if !c.drop.CompareAndSwap(true, false) {
		return c.Conn.Read(b)
	}
	// Wait for the server's answer, so the command surely ran, then lose it.
	_ = c.Conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64<<10)
	_, _ = c.Conn.Read(buf)
	c.Conn.Close()
	c.d.dropped.Add(1)
	return 0, io.ErrUnexpectedEOF
}

// Latency is a dialer for the Redis client that can slow every command:
// once Set, each write waits that long before it goes out, holding its
// connection, so calls queue for the client's pool as they would behind a
// slow Redis.
type Latency struct{ delay atomic.Int64 }

// Set makes every following write wait d (0: none).
func (l *Latency) Set(d time.Duration) { l.delay.Store(int64(d)) }

// Dial is the function to give the client as its Dialer.
func (l *Latency) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialWrapped(ctx, network, addr, func(c net.Conn) net.Conn { return &slowConn{Conn: c, l: l} })
}

type slowConn struct {
	net.Conn
	l *Latency
}

func (c *slowConn) Write(b []byte) (int, error) {
	if d := time.Duration(c.l.delay.Load()); d > 0 {
		time.Sleep(d) // time under test: the latency injected
	}
	return c.Conn.Write(b)
}

// Proxy forwards TCP connections from a loopback port to a target, and can
// cut them: Cut closes every open connection and refuses new ones until
// Restore. Tests put it between the gateway and PostgreSQL to make the
// ledger unreachable.
type Proxy struct {
	Addr   string // where to connect instead of the target
	target string
	ln     net.Listener
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards to target.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept) // owned by the proxy; ends when Close closes the listener
	return p, nil
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

func (p *Proxy) forward(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, up) {
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
	wg.Go(func() { _, _ = io.Copy(c, up); c.Close() })
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// Cut breaks every open connection and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Restore accepts connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() error {
	p.Cut()
	err := p.ln.Close()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
