package link

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// stream is one authenticated, ordered, bidirectional frame pipe between
// two nodes: a gRPC Exchange stream, or an in-process pipe. Every
// transport supplies one; everything above it (the Hello handshake, the
// codec, the policy, the inbox and PeerDown) is node's, shared.
type stream interface {
	// send writes one whole frame; it may retain frame. It blocks while
	// the other end is not reading, until close.
	send(frame []byte) error
	// recv returns the next whole frame, the receiver's own.
	recv() ([]byte, error)
	// close ends both directions; blocked and later calls fail. The
	// first cause wins.
	close(cause error)
}

// linkClass is what a link carries: everything (control), or only Page
// frames (pages), on transports that give page bytes a stream of their
// own (GRPC: a dedicated TLS connection, see BenchmarkPages).
type linkClass uint8

const (
	classControl linkClass = iota
	classPages
)

func (c linkClass) String() string {
	if c == classPages {
		return "page stream"
	}
	return "control"
}

// link is a stream that passed the handshake, with the identity of the
// node at its other end.
type link struct {
	peer  Identity
	class linkClass
	st    stream
	done  chan struct{}
	once  sync.Once
	err   error // the cause; set before done closes
}

func newLink(peer Identity, class linkClass, st stream) *link {
	return &link{peer: peer, class: class, st: st, done: make(chan struct{})}
}

// fail ends the link with cause (the first cause wins).
func (l *link) fail(cause error) {
	l.once.Do(func() {
		l.err = cause
		close(l.done)
		l.st.close(cause)
	})
}

// cause is why the link ended, or nil while it is up.
func (l *link) cause() error {
	select {
	case <-l.done:
		return l.err
	default:
		return nil
	}
}

// peerKey names the links to one peer of one class.
type peerKey struct {
	name  transfer.Peer
	class linkClass
}

// peerState serialises what this node sends to one peer on one class of
// link: one Send at a time, so frames keep their order and a link is
// opened once.
type peerState struct {
	sem chan struct{}
	cur *link  // guarded by node.mu; nil when no link is up
	buf []byte // encoding buffer for a copier stream; guarded by sem
}

// copier is a stream whose send is done with the frame when it returns,
// so that the frame's buffer can be reused.
type copier interface{ copiesFrames() }

// maxKeptBuffer bounds the encoding buffer a peer keeps between Sends.
const maxKeptBuffer = 4 << 20

// dialFunc opens a stream of a class to the node named to and says who
// answered (from its certificate). It must return once ctx ends.
type dialFunc func(ctx context.Context, to transfer.Peer, class linkClass) (stream, Identity, error)

// node is the part of every transport above the stream.
type node struct {
	self  Identity
	hello transfer.Hello
	opt   Options
	dial  dialFunc
	// pageStreams sends Page frames on links of classPages.
	pageStreams bool
	inbox       chan Inbound

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	peers  map[peerKey]*peerState
	links  map[*link]struct{}

	sent, received, refused, up, down atomic.Uint64
}

func newNode(hello transfer.Hello, opt Options, dial dialFunc) (*node, error) {
	opt.withDefaults()
	self := Identity{Name: hello.Node, Role: hello.Role}
	if err := self.Validate(); err != nil {
		return nil, err
	}
	// The Hello must itself be a frame this node's peers would accept.
	if _, err := transfer.EncodeFrame(&hello); err != nil {
		return nil, fmt.Errorf("link: this node's hello: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &node{
		self: self, hello: hello, opt: opt, dial: dial,
		inbox: make(chan Inbound, opt.InboxSize),
		ctx:   ctx, cancel: cancel,
		peers: make(map[peerKey]*peerState),
		links: make(map[*link]struct{}),
	}, nil
}

func (n *node) Inbox() <-chan Inbound { return n.inbox }

func (n *node) stats() Stats {
	n.mu.Lock()
	links := len(n.links)
	n.mu.Unlock()
	return Stats{Sent: n.sent.Load(), Received: n.received.Load(), Refused: n.refused.Load(),
		LinksUp: n.up.Load(), LinksDown: n.down.Load(), Links: links}
}

// Send implements Transport.Send.
func (n *node) Send(ctx context.Context, to transfer.Peer, m transfer.Message) error {
	if to == n.self.Name {
		return fmt.Errorf("%w: %s is this node", ErrNoRoute, to)
	}
	if _, ok := m.(*transfer.Hello); ok {
		return fmt.Errorf("%w: a hello is sent only by the handshake", ErrPolicy)
	}
	key := peerKey{to, classControl}
	if n.pageStreams && m.Type() == transfer.MsgPage {
		key.class = classPages
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return ErrClosed
	}
	ps := n.peers[key]
	if ps == nil {
		ps = &peerState{sem: make(chan struct{}, 1)}
		n.peers[key] = ps
	}
	n.mu.Unlock()

	select {
	case ps.sem <- struct{}{}:
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-n.ctx.Done():
		return ErrClosed
	}
	defer func() { <-ps.sem }()

	n.mu.Lock()
	l := ps.cur
	n.mu.Unlock()
	if l == nil || l.cause() != nil {
		// No link, or one that ended and whose reader has not yet
		// reported it: open a new one.
		var err error
		if l, err = n.connect(ctx, to, key.class); err != nil {
			return err
		}
	}
	var (
		frame []byte
		err   error
	)
	if _, ok := l.st.(copier); ok {
		// The stream is done with the frame when send returns: encode
		// into the peer's buffer (held, like the stream, under sem).
		frame, err = transfer.AppendFrame(ps.buf[:0], m)
		if cap(frame) <= maxKeptBuffer {
			ps.buf = frame[:0]
		}
	} else {
		// A fresh buffer per frame: the stream may retain it.
		frame, err = transfer.EncodeFrame(m)
	}
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		// Not yet written: the link need not be given up.
		return context.Cause(ctx)
	}
	if err := n.write(ctx, l, frame); err != nil {
		return err
	}
	n.sent.Add(1)
	return nil
}

// write hands frame to l. If ctx ends first the link is closed: the
// stream may hold part of the frame.
func (n *node) write(ctx context.Context, l *link, frame []byte) error {
	if err := l.cause(); err != nil {
		return fmt.Errorf("%w: %v: %w", ErrPeerDown, l.peer, err)
	}
	stop := context.AfterFunc(ctx, func() {
		l.fail(fmt.Errorf("send abandoned: %w", context.Cause(ctx)))
	})
	err := l.st.send(frame)
	if !stop() {
		// The link is failing (or failed) because ctx ended; wait for
		// the cause to be set.
		l.fail(fmt.Errorf("send abandoned: %w", context.Cause(ctx)))
	} else if err != nil {
		l.fail(err)
	} else {
		return nil
	}
	return fmt.Errorf("%w: %v: %w", ErrPeerDown, l.peer, l.cause())
}

// connect opens a link to to: dial, handshake, register, start reading.
func (n *node) connect(ctx context.Context, to transfer.Peer, class linkClass) (*link, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, n.opt.HandshakeTimeout, fmt.Errorf("%w: no hello within %v", ErrHandshake, n.opt.HandshakeTimeout))
	defer cancel()
	// The dial ends with the node, too.
	stop := context.AfterFunc(n.ctx, cancel)
	defer stop()
	st, peer, err := n.dial(ctx, to, class)
	if err != nil {
		if n.ctx.Err() != nil {
			return nil, ErrClosed
		}
		return nil, err
	}
	l := newLink(peer, class, st)
	if peer.Name != to {
		err := fmt.Errorf("%w: dialled %s, answered by %v", ErrAuth, to, peer)
		n.refuse(l, err)
		return nil, err
	}
	if err := n.handshake(ctx, l, true); err != nil {
		return nil, err
	}
	if err := n.start(l); err != nil {
		return nil, err
	}
	return l, nil
}

// accept runs the handshake on a stream a peer opened, in a goroutine of
// the node's; st is closed on every failure.
func (n *node) accept(st stream, peer Identity, class linkClass) error {
	l := newLink(peer, class, st)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		l.fail(ErrClosed)
		return ErrClosed
	}
	n.wg.Go(func() {
		ctx, cancel := context.WithTimeoutCause(n.ctx, n.opt.HandshakeTimeout, fmt.Errorf("%w: no hello within %v", ErrHandshake, n.opt.HandshakeTimeout))
		defer cancel()
		if err := n.handshake(ctx, l, false); err != nil {
			return
		}
		_ = n.start(l)
	})
	return nil
}

// handshake exchanges Hellos on l. The dialer sends its Hello first; the
// acceptor checks it before it answers with its own, so that it names any
// difference even if the dialer gives up at once. Each side checks the
// other's: the Hello names the node and role its certificate names, and
// transfer.CheckPeer passes (same protocol, layout, limits). An acceptor
// still answers a Hello that CheckPeer refuses (then closes the link), so
// that the dialer can name the difference too; it does not answer a node
// that claims another identity. On failure the link is closed with the
// error.
func (n *node) handshake(ctx context.Context, l *link, dialer bool) error {
	stop := context.AfterFunc(ctx, func() { l.fail(context.Cause(ctx)) })
	defer stop()
	fail := func(err error) error {
		if c := l.cause(); c != nil {
			// The stream broke because the link had already ended.
			err = c
		}
		if errors.Is(err, ErrPeerDown) {
			// Not a refusal: the stream broke.
			l.fail(err)
		} else {
			n.refuse(l, err)
		}
		return err
	}
	if dialer {
		if err := n.sendHello(l); err != nil {
			return fail(err)
		}
	}
	h, err := n.recvHello(l)
	if err != nil {
		return fail(err)
	}
	if h.Node != l.peer.Name || h.Role != l.peer.Role {
		return fail(fmt.Errorf("%w: hello says %v/%s, certificate says %v", ErrAuth, h.Role, h.Node, l.peer))
	}
	var mismatch error
	if err := transfer.CheckPeer(n.hello, *h); err != nil {
		mismatch = fmt.Errorf("%w: %v: %w", ErrHandshake, l.peer, err)
		n.report(l, mismatch)
	}
	if !dialer {
		if err := n.sendHello(l); err != nil && mismatch == nil {
			return fail(err)
		}
	}
	if mismatch != nil {
		l.fail(mismatch)
		return mismatch
	}
	return nil
}

func (n *node) sendHello(l *link) error {
	frame, err := transfer.EncodeFrame(&n.hello)
	if err != nil {
		return err
	}
	if err := l.st.send(frame); err != nil {
		return fmt.Errorf("%w: %w: %v: %w", ErrHandshake, ErrPeerDown, l.peer, err)
	}
	return nil
}

func (n *node) recvHello(l *link) (*transfer.Hello, error) {
	frame, err := l.st.recv()
	if err != nil {
		return nil, fmt.Errorf("%w: %w: %v: %w", ErrHandshake, ErrPeerDown, l.peer, err)
	}
	m, err := transfer.DecodeFrame(frame)
	if err != nil {
		return nil, fmt.Errorf("%w: %v: %w", ErrHandshake, l.peer, err)
	}
	h, ok := m.(*transfer.Hello)
	if !ok {
		return nil, fmt.Errorf("%w: %v opened with %v, not hello", ErrHandshake, l.peer, m.Type())
	}
	return h, nil
}

// start registers a link that passed the handshake and starts its reader.
func (n *node) start(l *link) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		l.fail(ErrClosed)
		return ErrClosed
	}
	count := 0
	for o := range n.links {
		if o.peer.Name == l.peer.Name && o.class == l.class {
			count++
		}
	}
	if count >= n.opt.MaxLinksPerPeer {
		err := fmt.Errorf("%w: %v already has %d %v links", ErrHandshake, l.peer, count, l.class)
		n.refused.Add(1)
		n.opt.Logger.Warn("link refused", "peer", l.peer.String(), "err", err)
		l.fail(err)
		return err
	}
	n.links[l] = struct{}{}
	key := peerKey{l.peer.Name, l.class}
	ps := n.peers[key]
	if ps == nil {
		ps = &peerState{sem: make(chan struct{}, 1)}
		n.peers[key] = ps
	}
	if ps.cur == nil || ps.cur.cause() != nil {
		ps.cur = l
	}
	n.up.Add(1)
	n.opt.Logger.Info("link up", "peer", l.peer.String(), "class", l.class.String())
	n.wg.Go(func() { n.read(l) })
	return nil
}

// read delivers l's frames to the inbox until the link ends, then reports
// PeerDown.
func (n *node) read(l *link) {
	defer n.ended(l)
	for {
		frame, err := l.st.recv()
		if err != nil {
			l.fail(err)
			return
		}
		m, err := transfer.DecodeFrame(frame)
		if err != nil {
			n.refuse(l, fmt.Errorf("link: frame from %v: %w", l.peer, err))
			return
		}
		if t := m.Type(); t == transfer.MsgHello || !n.opt.Policy(l.peer.Role, n.self.Role, t) {
			n.refuse(l, fmt.Errorf("%w: %v may not send %v to a %v node", ErrPolicy, l.peer, t, n.self.Role))
			return
		} else if l.class == classPages && t != transfer.MsgPage {
			n.refuse(l, fmt.Errorf("%w: %v sent %v on a page stream", ErrPolicy, l.peer, t))
			return
		}
		if l.cause() != nil {
			return
		}
		select {
		case n.inbox <- Inbound{From: l.peer, Msg: m}:
			n.received.Add(1)
		case <-l.done:
			return
		}
	}
}

// refuse closes l for something its peer sent, counting and logging it.
func (n *node) refuse(l *link, err error) {
	n.report(l, err)
	l.fail(err)
}

// report counts and logs a refusal, unless this node is closing.
func (n *node) report(l *link, err error) {
	if n.ctx.Err() == nil && !errors.Is(err, ErrClosed) {
		n.refused.Add(1)
		n.opt.Logger.Warn("link refused", "peer", l.peer.String(), "err", err)
	}
}

// ended unregisters l and, unless this node is closing, tells the driver.
func (n *node) ended(l *link) {
	n.mu.Lock()
	delete(n.links, l)
	if ps := n.peers[peerKey{l.peer.Name, l.class}]; ps != nil && ps.cur == l {
		ps.cur = nil
		for o := range n.links {
			if o.peer.Name == l.peer.Name && o.class == l.class && o.cause() == nil {
				ps.cur = o
				break
			}
		}
	}
	closing := n.closed
	n.mu.Unlock()
	if closing {
		return
	}
	n.down.Add(1)
	err := fmt.Errorf("%w: %v: %w", ErrPeerDown, l.peer, l.cause())
	n.opt.Logger.Info("link down", "peer", l.peer.String(), "class", l.class.String(), "err", err)
	select {
	case n.inbox <- Inbound{From: l.peer, Down: err}:
	case <-n.ctx.Done():
	}
}

// endLinks ends every link with the node named name, of either class and
// whichever side opened it; each is reported as a PeerDown.
func (n *node) endLinks(name transfer.Peer, cause error) {
	n.mu.Lock()
	var ls []*link
	for l := range n.links {
		if l.peer.Name == name {
			ls = append(ls, l)
		}
	}
	n.mu.Unlock()
	for _, l := range ls {
		l.fail(cause)
	}
}

// close ends every link, waits for the node's goroutines (after
// stopTransport, which must make blocked dials and streams return) and
// closes the inbox.
func (n *node) close(stopTransport func()) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	links := make([]*link, 0, len(n.links))
	for l := range n.links {
		links = append(links, l)
	}
	n.mu.Unlock()
	n.cancel()
	for _, l := range links {
		l.fail(fmt.Errorf("%w: %v closed", ErrClosed, n.self))
	}
	if stopTransport != nil {
		stopTransport()
	}
	n.wg.Wait()
	close(n.inbox)
}
