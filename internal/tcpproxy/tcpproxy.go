// Package tcpproxy is a TCP proxy for tests: it forwards connections to a
// target and can delay the target's replies, stop forwarding without
// closing anything (a dead connection that looks alive, as behind a NAT
// that dropped its state), or close every connection. Between a
// PostgreSQL client and server it can also drop messages of some types and
// reset the connection that carries a given command's completion (a COMMIT
// whose reply is lost after the server committed).
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
	reset   string // reset the connection that carries a CommandComplete with this tag, once
	resets  int    // connections reset so
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

// ResetOnCommandComplete arms the proxy once: the next PostgreSQL
// CommandComplete message with the given tag (such as "COMMIT" or
// "INSERT 0 1") that a target sends, on any connection, is not forwarded.
// Instead the client's side of that connection is reset (a TCP RST, after
// the messages before it) and the target's side closed: the server has
// done the command, and the client never hears so. The clients must not
// ask for TLS.
func (p *Proxy) ResetOnCommandComplete(tag string) {
	p.mu.Lock()
	p.reset = tag
	p.mu.Unlock()
}

// Resets returns how many connections ResetOnCommandComplete has reset.
func (p *Proxy) Resets() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resets
}

// takeReset reports whether a CommandComplete with tag must reset its
// connection, and disarms the proxy if so.
func (p *Proxy) takeReset(tag string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reset == "" || p.reset != tag {
		return false
	}
	p.reset = ""
	p.resets++
	return true
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
		go p.forward(t, c, false, nil)                        // client → target
		go p.forward(c, t, true, &pgStream{p: p, drop: drop}) // target → client, delayed, filtered
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

// chunk is bytes read from one side and when; reset: after writing b,
// reset dst and close src.
type chunk struct {
	b     []byte
	at    time.Time
	reset bool
}

// forward copies src to dst, delayed if delayed and the proxy has a delay,
// holding bytes while stalled, and passing what src sends through pg if
// it is not nil. It closes both when either side ends.
func (p *Proxy) forward(dst, src net.Conn, delayed bool, pg *pgStream) {
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
			if c.reset {
				if tc, ok := dst.(*net.TCPConn); ok {
					tc.SetLinger(0) // Close sends RST, not FIN
				}
				dst.Close()
				src.Close()
				break
			}
		}
		for range ch { // drain after a failed write
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b, reset := append([]byte(nil), buf[:n]...), false
			if pg != nil {
				b, reset = pg.feed(b)
			}
			ch <- chunk{b: b, at: time.Now(), reset: reset}
			if reset {
				break
			}
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

// pgStream follows the PostgreSQL messages that a server sends a client
// (type byte, 4-byte length, body), to drop some and to reset the
// connection at a given CommandComplete. A stream that does not start as
// PostgreSQL's does, or that turns to TLS, is forwarded as it is.
type pgStream struct {
	p       *Proxy
	drop    []byte // message types to drop, as set when the connection opened
	started bool   // past the first byte
	off     bool   // not following: forward as it is
	pending []byte // an incomplete message
}

// feed takes what the server sent next and returns what to forward, and
// whether to reset the connection after it.
func (s *pgStream) feed(b []byte) (out []byte, reset bool) {
	if s.off {
		return b, false
	}
	if !s.started && len(b) > 0 {
		s.started = true
		switch b[0] {
		case 'N': // the one-byte answer to an SSLRequest: no TLS
			out, b = append(out, 'N'), b[1:]
		case 'R', 'E': // authentication, or an error: the first message
		default: // 'S' (TLS follows) or not PostgreSQL
			s.off = true
			return b, false
		}
	}
	buf := append(s.pending, b...)
	s.pending = nil
	for len(buf) >= 5 {
		n := 1 + int(binary.BigEndian.Uint32(buf[1:5]))
		if n < 5 { // no message is shorter: lost track, stop following
			s.off = true
			return append(out, buf...), false
		}
		if len(buf) < n {
			break
		}
		msg := buf[:n]
		buf = buf[n:]
		if msg[0] == 'C' && s.p.takeReset(string(bytes.TrimRight(msg[5:], "\x00"))) {
			return out, true
		}
		if !bytes.Contains(s.drop, msg[:1]) {
			out = append(out, msg...)
		}
	}
	s.pending = append([]byte(nil), buf...)
	return out, false
}
