// Package tcpproxy is a TCP proxy for tests: it forwards connections to a
// target and can delay the target's replies, stop forwarding without
// closing anything (a dead connection that looks alive, as behind a NAT
// that dropped its state), or close every connection.
package tcpproxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy listens on a loopback port and forwards every connection to its
// target. It is safe for concurrent use by multiple goroutines.
type Proxy struct {
	ln net.Listener

	mu      sync.Mutex // protects the fields below
	target  string
	delay   time.Duration
	drop    []byte // PostgreSQL message types dropped from the target's replies
	stalled bool
	resume  chan struct{} // closed when forwarding resumes
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// Start starts a proxy to target (host:port) on 127.0.0.1.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, resume: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetTarget makes new connections go to target (host:port); open ones keep
// theirs. A target that refuses makes the proxy close the client's
// connection at once.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Addr returns the host:port to connect to instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay makes every byte from the target reach the client d after it
// left the target (0: no delay). It applies to bytes read from then on.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// DropPostgresMessages makes the proxy parse what the target sends as
// PostgreSQL protocol messages (type byte, 4-byte length) and drop those
// of the given types, for connections opened from then on: with 'A'
// (NotificationResponse) it is a connection that accepts LISTEN and
// delivers nothing, as a PgBouncer in transaction pooling mode is. The
// clients must not ask for TLS.
func (p *Proxy) DropPostgresMessages(types ...byte) {
	p.mu.Lock()
	p.drop = append([]byte(nil), types...)
	p.mu.Unlock()
}

// Stall stops forwarding in both directions without closing either side:
// bytes are held, not dropped, until Resume.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled = true
		p.resume = make(chan struct{})
	}
}

// Resume forwards the held bytes and what follows.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
}

// CloseConns closes every connection open now; the proxy keeps accepting.
func (p *Proxy) CloseConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		t, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, t) {
			return
		}
		p.mu.Lock()
		drop := p.drop
		p.mu.Unlock()
		p.wg.Add(2)
		go p.forward(t, c, false, nil) // client → target
		go p.forward(c, t, true, drop) // target → client, delayed, filtered
	}
}

// track registers both ends of a connection, unless the proxy is closed.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
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

// chunk is bytes read from one side and when.
type chunk struct {
	b  []byte
	at time.Time
}

// forward copies src to dst, delayed if delayed and the proxy has a delay,
// holding bytes while stalled and dropping PostgreSQL messages of the
// types in drop. It closes both when either side ends.
func (p *Proxy) forward(dst, src net.Conn, delayed bool, drop []byte) {
	defer p.wg.Done()
	ch := make(chan chunk, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range ch {
			p.mu.Lock()
			d, stalled, resume := p.delay, p.stalled, p.resume
			p.mu.Unlock()
			if stalled {
				<-resume
			}
			if delayed && d > 0 {
				time.Sleep(time.Until(c.at.Add(d)))
			}
			if _, err := dst.Write(c.b); err != nil {
				break
			}
		}
		for range ch { // drain after a failed write
		}
	}()
	buf := make([]byte, 32<<10)
	var pending []byte // an incomplete message, when filtering
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b := append([]byte(nil), buf[:n]...)
			if len(drop) > 0 {
				b, pending = filterMessages(append(pending, b...), drop)
			}
			ch <- chunk{b: b, at: time.Now()}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				src.Close()
			}
			break
		}
	}
	close(ch)
	<-done
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// filterMessages returns the complete PostgreSQL messages at the start of b
// whose type is not in drop, and the incomplete rest of b.
func filterMessages(b, drop []byte) (kept, rest []byte) {
	for len(b) >= 5 {
		n := 1 + int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < n {
			break
		}
		if !bytes.Contains(drop, b[:1]) {
			kept = append(kept, b[:n]...)
		}
		b = b[n:]
	}
	return kept, append([]byte(nil), b...)
}
