package link

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// Network is a set of nodes in one process (`pagewarden serve`, tests)
// linked by Inproc transports. Identity comes from Join, which trusted
// code calls; everything else is as on a network link: every message is
// framed and decoded by the transfer codec, each link starts with the
// Hello handshake, and the receiver applies its Policy.
type Network struct {
	mu    sync.Mutex
	nodes map[transfer.Peer]*Inproc
}

// NewNetwork returns an empty in-process network.
func NewNetwork() *Network { return &Network{nodes: make(map[transfer.Peer]*Inproc)} }

// Inproc is a node's transport on a Network.
type Inproc struct {
	net *Network
	*node
}

var _ Transport = (*Inproc)(nil)

// pipeDepth is how many frames an in-process link buffers each way before
// Send waits for the receiver.
const pipeDepth = 4

// Join adds the node hello names (with its role) to the network. The name
// must be new; it is free again once the node's transport is closed.
func (nw *Network) Join(hello transfer.Hello, opt Options) (*Inproc, error) {
	t := &Inproc{net: nw}
	n, err := newNode(hello, opt, t.dial)
	if err != nil {
		return nil, err
	}
	t.node = n
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nw.nodes[hello.Node] != nil {
		return nil, fmt.Errorf("link: node %s already joined", hello.Node)
	}
	nw.nodes[hello.Node] = t
	return t, nil
}

// dial opens a pipe; an in-process link carries every class.
func (t *Inproc) dial(_ context.Context, to transfer.Peer, class linkClass) (stream, Identity, error) {
	t.net.mu.Lock()
	dst := t.net.nodes[to]
	t.net.mu.Unlock()
	if dst == nil {
		return nil, Identity{}, fmt.Errorf("%w: no node %s in this process", ErrNoRoute, to)
	}
	near, far := newPipe()
	if err := dst.accept(far, t.self, class); err != nil {
		near.close(err)
		return nil, Identity{}, fmt.Errorf("%w: %s: %w", ErrNoRoute, to, err)
	}
	return near, dst.self, nil
}

// Stats returns the transport's counters.
func (t *Inproc) Stats() Stats { return t.stats() }

// Close implements Transport.Close.
func (t *Inproc) Close() error {
	t.close(nil)
	t.net.mu.Lock()
	if t.net.nodes[t.self.Name] == t {
		delete(t.net.nodes, t.self.Name)
	}
	t.net.mu.Unlock()
	return nil
}

// pipe is an in-process stream: two bounded channels and one shared end.
type pipe struct {
	done chan struct{}
	once sync.Once
	errs [2]error // the cause as each end sees it
}

type pipeEnd struct {
	p    *pipe
	side int
	in   <-chan []byte
	out  chan<- []byte
}

func newPipe() (*pipeEnd, *pipeEnd) {
	p := &pipe{done: make(chan struct{})}
	ab, ba := make(chan []byte, pipeDepth), make(chan []byte, pipeDepth)
	return &pipeEnd{p: p, side: 0, in: ba, out: ab}, &pipeEnd{p: p, side: 1, in: ab, out: ba}
}

func (e *pipeEnd) send(frame []byte) error {
	select {
	case <-e.p.done:
		return e.p.errs[e.side]
	default:
	}
	select {
	case e.out <- frame:
		return nil
	case <-e.p.done:
		return e.p.errs[e.side]
	}
}

// recv returns what the other end sent before it closed, then the cause,
// as a network stream does.
func (e *pipeEnd) recv() ([]byte, error) {
	select {
	case f := <-e.in:
		return f, nil
	default:
	}
	select {
	case f := <-e.in:
		return f, nil
	case <-e.p.done:
		return nil, e.p.errs[e.side]
	}
}

// close ends the pipe. The other end sees the cause as text, as it would
// from a remote node: this end's sentinels (ErrClosed) are not its own.
func (e *pipeEnd) close(cause error) {
	e.p.once.Do(func() {
		e.p.errs[e.side] = cause
		e.p.errs[1-e.side] = errors.New("closed by the other end: " + cause.Error())
		close(e.p.done)
	})
}
