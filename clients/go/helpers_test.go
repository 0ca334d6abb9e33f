package sluice

// Shared test helpers: a socket path per test, clients that are always closed, waiting.

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// socketPath is a fresh path in a short directory (Unix socket paths are limited to ~107 bytes),
// removed when the test ends.
func socketPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "sluice-go-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "agent.sock")
}

// newClient makes a client on path whose notices are discarded unless an option says otherwise;
// it is closed (briefly) when the test ends.
func newClient(t testing.TB, path string, opts ...Option) *Client {
	t.Helper()
	c, err := New(path, append([]Option{WithNoticeOutput(io.Discard)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(timeout(200 * time.Millisecond)) })
	return c
}

// newLogger is a slog.Logger writing only to c, at every level.
func newLogger(c *Client, opts *HandlerOptions) *slog.Logger {
	if opts == nil {
		opts = &HandlerOptions{}
	}
	if opts.Level == nil {
		opts.Level = slog.LevelDebug
	}
	return slog.New(c.Handler(opts))
}

// timeout is a context that ends after d; its resources are freed when d has passed.
func timeout(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	time.AfterFunc(d, cancel)
	return ctx
}

// waitUntil polls cond until it holds (true) or timeout passes (false).
func waitUntil(cond func() bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// flush fails the test unless everything went within d.
func flush(t testing.TB, c *Client, d time.Duration) {
	t.Helper()
	if err := c.Flush(timeout(d)); err != nil {
		t.Fatalf("flush: %v; stats %+v", err, c.Stats())
	}
}

// lockedBuffer is an io.Writer tests can read while the sender writes notices to it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// take returns what was written since the last take.
func (b *lockedBuffer) take() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := string(b.buf)
	b.buf = nil
	return s
}

var _ io.Writer = (*lockedBuffer)(nil)

// slowestCall is the longest of n calls of call, as each is made (a caller never waits for the
// sender: a call held behind its backoff, 20 ms doubling to 2 s, stands out), and all of them.
func slowestCall(n int, call func(i int)) (slowest, all time.Duration) {
	started := time.Now()
	for i := 0; i < n; i++ {
		before := time.Now()
		call(i)
		slowest = max(slowest, time.Since(before))
	}
	return slowest, time.Since(started)
}

// maxCallPause bounds a single logging call: far above a call's microseconds (room for -race, a
// collection and a busy machine), below a sender's backoff step from 640 ms on.
const maxCallPause = 500 * time.Millisecond
