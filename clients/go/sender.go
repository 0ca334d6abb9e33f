package sluice

// The sender goroutine: the only code that touches the agent's socket.
//
// Owns: dialing (lazily, when there is a record to send, and again after every failure with
// jittered exponential backoff, forever — a missing socket file and a refused connection alike),
// the acknowledged-mode handshake, writing queued records in batches, the stderr notices, and in
// acknowledged mode one ACK reader goroutine per connection that settles records in the queue.
// After a lost connection, what it had not settled is sent again, in order, on the next one.
//
// Must not: drop or reorder records (the drop policy is the queue's, applied on the caller's
// side), hold the queue's mutex during I/O, or outlive Close by more than a short bounded wait
// (every write waits at most ioTick, and Close shuts the connection).

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// backoffFirst and backoffMax bound the wait between dial attempts: doubling from the first
	// to the largest, each drawn uniformly from its upper half.
	backoffFirst = 20 * time.Millisecond
	backoffMax   = 2 * time.Second
	// dialTimeout: a full listen backlog makes connect wait.
	dialTimeout = time.Second
	// handshakeTimeout: the agent's "OK <ack point>" must come within this.
	handshakeTimeout = 5 * time.Second
	// ioTick is the longest single wait in a write: how soon a stop or a due stderr notice is seen
	// while the agent is not reading.
	ioTick = 250 * time.Millisecond
	// idleWait is the sender's longest idle wait (records wake it; this is a safety net).
	idleWait = 5 * time.Second
	// lingerWait is how long the sender lets a burst gather before it writes (sender.linger).
	lingerWait = 2 * time.Millisecond
	// One write takes at most this many records or bytes (at least one record).
	batchRecords = 1024
	batchBytes   = 256 << 10
	// maxAnswerLine: a line from the agent longer than this is not an answer of the protocol.
	maxAnswerLine = 4096
)

// backoff is jittered exponential backoff.
type backoff struct {
	first, largest, next time.Duration
}

func newBackoff() *backoff {
	return &backoff{first: backoffFirst, largest: backoffMax, next: backoffFirst}
}

func (b *backoff) delay() time.Duration {
	d := b.next
	b.next = min(2*b.next, b.largest)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

func (b *backoff) reset() { b.next = b.first }

// connection is one connection to the agent; gen is the queue's name for it.
type connection struct {
	conn   *net.UnixConn
	gen    uint64
	next   uint64 // acknowledged mode: the number the agent gives the next record on it
	opened time.Time
	broken atomic.Bool
	once   sync.Once
}

// shut marks the connection broken and closes it, which ends a write or a read waiting on it in
// another goroutine. It reports whether this call broke it (false: someone else did first).
func (c *connection) shut() bool {
	first := c.broken.CompareAndSwap(false, true)
	c.once.Do(func() { c.conn.Close() })
	return first
}

// sender is started by New and stopped by Close.
type sender struct {
	q            *queue
	path         string
	acknowledged bool
	notices      io.Writer

	stopCh  chan struct{} // closed by Close
	done    chan struct{} // closed when run returns
	current atomic.Pointer[connection]
	// lostAfter: how long the last connection lost had lived (ns; 0 once the next dial decided
	// its backoff on it).
	lostAfter atomic.Int64

	connectedBefore bool
	batch           []batchEntry
	buf             []byte
}

var errStopped = errors.New("stopped")

func newSender(q *queue, path string, acknowledged bool, notices io.Writer) *sender {
	return &sender{
		q:            q,
		path:         path,
		acknowledged: acknowledged,
		notices:      notices,
		stopCh:       make(chan struct{}),
		done:         make(chan struct{}),
	}
}

// stop tells the sender to end, shuts its connection and waits up to wait for it.
func (s *sender) stop(wait time.Duration) {
	close(s.stopCh)
	if c := s.current.Load(); c != nil {
		c.shut()
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-s.done:
	case <-timer.C:
	}
}

func (s *sender) stopped() bool {
	select {
	case <-s.stopCh:
		return true
	default:
		return false
	}
}

func (s *sender) run() {
	defer close(s.done)
	b := newBackoff()
	for !s.stopped() {
		s.step(b)
	}
	if c := s.current.Load(); c != nil {
		c.shut()
	}
}

// step waits for records, dials if need be and writes one batch. A panic here (a bug) must not
// end shipping for good, nor the application: it is recorded and the sender carries on.
func (s *sender) step(b *backoff) {
	defer func() {
		if p := recover(); p != nil {
			s.q.connectFailed(fmt.Sprintf("internal error: %v", p))
			if c := s.current.Load(); c != nil {
				s.lose(c, nil)
			}
			s.sleep(b.delay())
		}
	}()
	s.waitForWork()
	s.writeNotice()
	if s.stopped() || !s.q.hasPending() {
		return
	}
	s.linger()
	if s.stopped() || !s.q.hasPending() { // Close stops the queue before the sender
		return
	}
	c := s.current.Load()
	if c == nil || c.broken.Load() {
		if c != nil {
			s.lose(c, nil)
		}
		if lived := time.Duration(s.lostAfter.Swap(0)); lived > 0 {
			if lived < backoffMax {
				// The last connection ended soon after it opened — an agent that accepts and
				// closes at once (over its max_connections, a peer it does not allow) — so back
				// off as for a failed dial instead of dialling again at once.
				s.sleep(b.delay())
				return
			}
			b.reset()
		}
		if c = s.connect(); c == nil {
			s.sleep(b.delay())
			return
		}
	}
	if s.acknowledged {
		s.sendNumbered(c)
	} else {
		s.sendPlain(c)
	}
}

func (s *sender) waitForWork() {
	if s.q.readyOrWait() {
		return
	}
	wait := idleWait
	if due, ok := s.q.noticeDueIn(); ok {
		wait = min(wait, due)
	}
	timer := time.NewTimer(wait)
	select {
	case <-s.q.wake:
	case <-s.stopCh:
	case <-timer.C:
	}
	timer.Stop()
	s.q.doneWaiting()
}

// linger lets a burst gather for up to lingerWait before the sender writes it, unless half a
// batch is queued (by records or bytes) or Flush or Close waits: the records a burst logs
// meanwhile go in one write and wake the agent once, not once each (with the agent on the same
// cores, a wake-up per record took CPU from the logging goroutines: their p99.9). The record
// that crosses half a batch, Flush, Close and a stop end it early. A record reaches the agent at
// most lingerWait later.
func (s *sender) linger() {
	if !s.q.startLinger(batchRecords/2, batchBytes/2) {
		return
	}
	timer := time.NewTimer(lingerWait)
	select {
	case <-timer.C:
	case <-s.q.wake:
	case <-s.stopCh:
	}
	timer.Stop()
	s.q.endLinger()
}

// sleep is the backoff: a wait that Close cuts short.
func (s *sender) sleep(d time.Duration) {
	timer := time.NewTimer(d)
	select {
	case <-timer.C:
	case <-s.stopCh:
	}
	timer.Stop()
}

func (s *sender) connect() *connection {
	conn, err := net.DialTimeout("unix", s.path, dialTimeout)
	if err != nil {
		s.q.connectFailed(describe(err))
		return nil
	}
	unix, ok := conn.(*net.UnixConn)
	if !ok { // cannot happen for "unix"
		conn.Close()
		s.q.connectFailed(fmt.Sprintf("unexpected connection type %T", conn))
		return nil
	}
	var (
		reader   *bufio.Reader
		ackPoint string
		first    uint64
	)
	if s.acknowledged {
		reader = bufio.NewReaderSize(unix, maxAnswerLine)
		first = s.q.firstUnsettled()
		if ackPoint, err = s.handshake(unix, reader, first); err != nil {
			unix.Close()
			s.q.connectFailed(describe(err))
			return nil
		}
	}
	c := &connection{conn: unix, next: first, opened: time.Now()}
	c.gen = s.q.connectionOpened(ackPoint, s.connectedBefore)
	s.connectedBefore = true
	s.current.Store(c)
	if s.stopped() { // Close ran while we dialed: it did not see this connection
		c.shut()
	}
	if s.acknowledged {
		go s.readAcks(c, reader)
	}
	return c
}

// handshake opens the client session from the first record not acknowledged and returns the
// agent's ack point ("spooled" or "delivered").
func (s *sender) handshake(conn *net.UnixConn, reader *bufio.Reader, first uint64) (string, error) {
	if err := conn.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintf(conn, "SLUICE/2 ACK session=%s first=%d\n", s.q.session, first); err != nil {
		return "", err
	}
	line, err := reader.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, io.EOF) {
			return "", errors.New("the agent closed the connection during the handshake")
		}
		return "", err
	}
	words := bytes.Fields(line)
	if len(words) != 2 || string(words[0]) != "OK" {
		return "", fmt.Errorf("the agent answered %.80q to SLUICE/2 ACK", line)
	}
	return string(words[1]), conn.SetDeadline(time.Time{})
}

func (s *sender) sendPlain(c *connection) {
	s.batch = s.q.peek(s.batch[:0], batchRecords, batchBytes)
	if len(s.batch) == 0 {
		return
	}
	s.buf = s.buf[:0]
	for _, e := range s.batch {
		s.buf = append(s.buf, e.data...)
	}
	written, err := s.write(c, s.buf)
	whole, end := 0, 0
	for _, e := range s.batch {
		end += len(e.data)
		if end > written {
			break
		}
		whole++
	}
	// A record cut by a failed write stays queued and goes again whole on the next connection;
	// only the agent's end can have seen its first part (and it refuses a line the writer did not
	// end: truncated).
	s.q.commit(whole)
	clear(s.batch) // drop references to records the queue let go of
	if err != nil {
		s.lose(c, err)
	}
}

func (s *sender) sendNumbered(c *connection) {
	s.batch = s.q.takeNumbered(s.batch[:0], c.gen, batchRecords, batchBytes)
	if len(s.batch) == 0 {
		return
	}
	if s.batch[0].seq != c.next { // the queue and the agent would disagree on numbers: start over
		s.lose(c, fmt.Errorf("internal error: record %d where %d was due", s.batch[0].seq, c.next))
		return
	}
	c.next += uint64(len(s.batch))
	// Each line: the time it was logged, then the record (the same on every send).
	s.buf = s.buf[:0]
	for _, e := range s.batch {
		s.buf = strconv.AppendInt(s.buf, e.timeUs, 10)
		s.buf = append(s.buf, ' ')
		s.buf = append(s.buf, e.data...)
	}
	clear(s.batch)
	if _, err := s.write(c, s.buf); err != nil {
		s.lose(c, err)
	}
}

// write writes data; it returns how many bytes went, and why it stopped short if it did.
func (s *sender) write(c *connection, data []byte) (int, error) {
	done := 0
	for done < len(data) {
		if s.stopped() {
			return done, errStopped
		}
		if c.broken.Load() {
			return done, nil
		}
		if err := c.conn.SetWriteDeadline(time.Now().Add(ioTick)); err != nil {
			return done, err
		}
		n, err := c.conn.Write(data[done:])
		done += n
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				s.writeNotice() // the agent is not reading: drops may be piling up
				continue
			}
			return done, err
		}
	}
	return done, nil
}

// lose ends connection c: its unsettled records go back to wait, to be sent on the next one.
func (s *sender) lose(c *connection, err error) {
	errText := ""
	if c.shut() && err != nil && !errors.Is(err, errStopped) {
		errText = describe(err)
	}
	s.q.connectionLost(c.gen, errText)
	if s.current.CompareAndSwap(c, nil) {
		s.lostAfter.Store(max(int64(time.Since(c.opened)), 1))
	}
}

func (s *sender) writeNotice() {
	line, ok := s.q.takeNotice(s.path)
	if !ok || s.notices == nil {
		return
	}
	io.WriteString(s.notices, line) // a closed or broken stderr: the counters still say it
}

// readAcks is the ACK reader of one connection (acknowledged mode): it settles records as the
// agent answers, until the connection ends.
func (s *sender) readAcks(c *connection, reader *bufio.Reader) {
	var failure error
	for {
		line, err := reader.ReadSlice('\n')
		if err != nil {
			switch {
			case errors.Is(err, bufio.ErrBufferFull):
				failure = errors.New("an unreadable answer from the agent")
			case errors.Is(err, io.EOF):
				failure = errors.New("the agent closed the connection")
			default:
				failure = err
			}
			break
		}
		words := bytes.Fields(line)
		if len(words) < 2 {
			continue
		}
		number, err := strconv.ParseUint(string(words[1]), 10, 64)
		if err != nil {
			continue // a line this version does not know
		}
		switch {
		case string(words[0]) == "ACK" && len(words) == 2:
			s.q.ack(c.gen, number)
		case string(words[0]) == "NAK" && len(words) >= 3:
			s.q.nak(c.gen, number, string(words[2]))
		}
	}
	errText := ""
	if c.shut() { // we found it broken; otherwise the sender or Close shut it, and said why
		errText = describe(failure)
	}
	s.q.connectionLost(c.gen, errText)
}

// describe is a short text for an error: "ENOENT", "ECONNREFUSED"…, or the error's words.
func describe(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if name, ok := errnoNames[errno]; ok {
			return name
		}
		return errno.Error()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return "timeout"
	}
	return err.Error()
}

var errnoNames = map[syscall.Errno]string{
	syscall.ENOENT:       "ENOENT",
	syscall.ECONNREFUSED: "ECONNREFUSED",
	syscall.ECONNRESET:   "ECONNRESET",
	syscall.EPIPE:        "EPIPE",
	syscall.EACCES:       "EACCES",
	syscall.EPERM:        "EPERM",
	syscall.EAGAIN:       "EAGAIN",
	syscall.ENOTSOCK:     "ENOTSOCK",
	syscall.ENOTDIR:      "ENOTDIR",
	syscall.EPROTOTYPE:   "EPROTOTYPE",
	syscall.ETIMEDOUT:    "ETIMEDOUT",
}
