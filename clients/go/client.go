package sluice

// The Client: options, the sender's lifecycle, Flush and Close with bounded waits.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"
)

const (
	// DefaultSocketPath is where the agent listens in the pod (helm/sluice: a shared emptyDir at
	// /run/sluice), unless SocketEnv names another path.
	DefaultSocketPath = "/run/sluice/sluice.sock"
	// SocketEnv is the environment variable the chart and `sluice inject` set in the app's
	// container to the agent's socket.
	SocketEnv = "SLUICE_SOCKET"
	// DefaultMaxQueueRecords and DefaultMaxQueueBytes bound what the client holds: queued, and
	// in acknowledged mode sent and awaiting an acknowledgement.
	DefaultMaxQueueRecords = 8192
	DefaultMaxQueueBytes   = 8 << 20
	// DefaultMaxRecordSize is the agent's default max_record_size for a listener.
	DefaultMaxRecordSize = 1 << 20
	// DefaultDropBelowWarnAt is the high-water mark, as a fraction of either bound.
	DefaultDropBelowWarnAt = 0.8
	// DefaultTimeout is how long Flush and Close wait when their context has no deadline.
	DefaultTimeout = 2 * time.Second
)

// senderJoinWait is how long Close waits for the sender goroutine after telling it to stop.
const senderJoinWait = 300 * time.Millisecond

// Option configures a Client.
type Option func(*config)

type config struct {
	maxRecords      int
	maxBytes        int
	maxRecordSize   int
	dropBelowWarnAt float64
	acknowledged    bool
	notices         io.Writer
}

// WithMaxQueueRecords bounds the records held: queued, plus (acknowledged mode) sent and not yet
// acknowledged. Default 8,192.
func WithMaxQueueRecords(n int) Option { return func(c *config) { c.maxRecords = n } }

// WithMaxQueueBytes bounds the bytes held, counted the same way; whichever bound is reached first
// applies. Default 8 MiB.
func WithMaxQueueBytes(n int) Option { return func(c *config) { c.maxBytes = n } }

// WithMaxRecordSize is the listener's max_record_size: longer records are cut to it
// ("truncated": true) instead of being refused by the agent. Default 1 MiB.
func WithMaxRecordSize(n int) Option { return func(c *config) { c.maxRecordSize = n } }

// WithDropBelowWarnAt sets the high-water mark: above this fraction of either bound, records
// below slog.LevelWarn are dropped, keeping the rest of the room for warnings and errors.
// Default 0.8; 1 turns the tier off.
func WithDropBelowWarnAt(fraction float64) Option {
	return func(c *config) { c.dropBelowWarnAt = fraction }
}

// WithAcknowledged turns on acknowledged mode: a client session (SLUICE/2) in which a record is
// held until the agent's ACK and is sent again after a reconnect as the same record, so that the
// persister keeps exactly one row per record.
func WithAcknowledged(on bool) Option { return func(c *config) { c.acknowledged = on } }

// WithNoticeOutput sets where the client's own notices go — a line about drops at most once a
// minute, and a summary at Close if records were lost. Default os.Stderr; nil for none.
func WithNoticeOutput(w io.Writer) Option { return func(c *config) { c.notices = w } }

// Client ships records to one agent socket. It is safe for concurrent use; make one per process
// (or per socket) and share it between handlers and writers.
type Client struct {
	path string
	cfg  config
	q    *queue
	s    *sender

	closeOnce sync.Once
	closeErr  error

	mu        sync.Mutex
	stalledAt uint64 // the queue's progress when Flush last gave up
	stalled   bool
}

// New makes a client of the agent listening at socketPath ("" for $SLUICE_SOCKET, else
// DefaultSocketPath) and starts
// its sender, which dials when the first record arrives. The agent need not be there: records
// queue (within the bounds) until it is. New fails only for invalid options.
func New(socketPath string, opts ...Option) (*Client, error) {
	cfg := config{
		maxRecords:      DefaultMaxQueueRecords,
		maxBytes:        DefaultMaxQueueBytes,
		maxRecordSize:   DefaultMaxRecordSize,
		dropBelowWarnAt: DefaultDropBelowWarnAt,
		notices:         os.Stderr,
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	switch {
	case cfg.maxRecords < 1 || cfg.maxBytes < 1:
		return nil, errors.New("sluice: the queue's bounds must be positive")
	case cfg.maxRecordSize < 256 || cfg.maxRecordSize > 64<<20:
		return nil, fmt.Errorf("sluice: max record size %d is not between 256 B and 64 MiB", cfg.maxRecordSize)
	case !(cfg.dropBelowWarnAt > 0 && cfg.dropBelowWarnAt <= 1):
		return nil, fmt.Errorf("sluice: drop-below-warn fraction %v is not in (0, 1]", cfg.dropBelowWarnAt)
	}
	if socketPath == "" {
		socketPath = os.Getenv(SocketEnv)
	}
	if socketPath == "" {
		socketPath = DefaultSocketPath
	}
	q := newQueue(cfg.maxRecords, cfg.maxBytes, cfg.dropBelowWarnAt)
	c := &Client{path: socketPath, cfg: cfg, q: q, s: newSender(q, socketPath, cfg.acknowledged, cfg.notices)}
	go c.s.run()
	return c, nil
}

// Session is this client's session (SLUICE/2), 32 hex digits: a UUIDv7 drawn by New.
func (c *Client) Session() string { return c.q.session }

// Stats returns the client's counters.
func (c *Client) Stats() Stats { return c.q.stats() }

// enqueue offers one encoded record (without its newline) to the queue. It copies the record:
// the caller's buffer goes back to its pool.
func (c *Client) enqueue(record []byte, level slog.Level, replaced, truncated bool, at time.Time) {
	data := make([]byte, len(record)+1)
	copy(data, record)
	data[len(record)] = '\n'
	c.q.offer(data, level, replaced, truncated, at.UnixMicro())
}

// Flush waits until every record is written to the socket (acknowledged mode: acknowledged), or
// until ctx is done — at most DefaultTimeout if ctx has no deadline. It returns nil once
// everything went, otherwise the context's error.
func (c *Client) Flush(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if c.q.waitSettled(ctx.Done()) {
		c.setStalled(false)
		return nil
	}
	c.setStalled(true)
	return ctx.Err()
}

func (c *Client) setStalled(stalled bool) {
	c.mu.Lock()
	c.stalled = stalled
	c.stalledAt = c.q.progressCount()
	c.mu.Unlock()
}

// Close drains the queue until ctx is done (at most DefaultTimeout if ctx has no deadline), then
// stops the sender. Records still queued are counted dropped (closed); records sent and not
// acknowledged, Unconfirmed. Records logged afterwards are dropped (closed). If anything was lost
// over the client's life (dropped, refused, unconfirmed), Close writes one summary line to the
// notice output (stderr). It returns an error if it stopped waiting before everything went.
// Calling Close again does nothing and returns the same.
func (c *Client) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { c.closeErr = c.close(ctx) })
	return c.closeErr
}

func (c *Client) close(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	c.q.close()
	c.mu.Lock()
	stalled := c.stalled && c.stalledAt == c.q.progressCount()
	c.mu.Unlock()
	// A Flush that just waited in vain, with nothing moved since, is not waited for again.
	drained := !stalled && c.q.waitSettled(ctx.Done())
	before := c.q.stats()
	c.q.stop()
	c.s.stop(senderJoinWait)
	if line, ok := c.q.summary(c.path); ok && c.cfg.notices != nil {
		io.WriteString(c.cfg.notices, line)
	}
	if drained {
		return nil
	}
	return fmt.Errorf("sluice: close: %d record(s) not sent and %d not acknowledged when it stopped waiting: %w",
		before.Queued, before.Unacknowledged, context.DeadlineExceeded)
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx == nil {
		ctx = context.Background()
	}
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultTimeout)
}

// uuid7Hex is a UUIDv7 (RFC 9562: Unix milliseconds, then random bits) as 32 hex digits.
func uuid7Hex() string {
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		// crypto/rand does not fail on Linux; fall back to the clock rather than panic.
		binary.BigEndian.PutUint64(id[8:], uint64(time.Now().UnixNano()))
	}
	ms := uint64(time.Now().UnixMilli())
	id[0], id[1], id[2] = byte(ms>>40), byte(ms>>32), byte(ms>>24)
	id[3], id[4], id[5] = byte(ms>>16), byte(ms>>8), byte(ms)
	id[6] = id[6]&0x0f | 0x70 // version 7
	id[8] = id[8]&0x3f | 0x80 // variant 10
	return hex.EncodeToString(id[:])
}
