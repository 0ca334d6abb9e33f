package sluice

// Starting, flushing and closing: bounded waits, and nothing lost without being counted.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTheSenderDialsWithTheFirstRecordNotBefore(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	time.Sleep(50 * time.Millisecond)
	if connections, _, _, _ := agent.snapshot(); connections != 0 {
		t.Fatal("no connection before there is something to send")
	}
	newLogger(c, nil).Info("first")
	agent.expect(t, 1)
	if connections, _, _, _ := agent.snapshot(); connections != 1 {
		t.Errorf("%d connections", connections)
	}
}

func TestFlushReturnsNilOnceEverythingIsWritten(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	log := newLogger(c, nil)
	for i := 0; i < 1000; i++ {
		log.Info("record", "i", i)
	}
	flush(t, c, 5*time.Second)
	if s := c.Stats(); s.Sent != 1000 || s.Queued != 0 {
		t.Errorf("stats %+v", s)
	}
	if n := len(agent.expect(t, 1000)); n != 1000 {
		t.Errorf("%d records", n)
	}
}

func TestCloseReturnsWithinItsDeadlineWithAStalledAgent(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	notices := &lockedBuffer{}
	c := newClient(t, path, WithMaxQueueBytes(64<<20), WithMaxQueueRecords(100_000), WithNoticeOutput(notices))
	log := newLogger(c, nil)
	log.Info("connect first")
	agent.expect(t, 1)
	agent.stall()
	payload := strings.Repeat("p", 1000)
	for i := 0; i < 5000; i++ { // 5 MB: far more than the socket buffers hold
		log.Info(payload)
	}
	time.Sleep(200 * time.Millisecond)
	if c.Stats().Queued == 0 {
		t.Fatal("the sender should be held by the stalled agent")
	}

	started := time.Now()
	err := c.Close(timeout(500 * time.Millisecond))
	// The deadline, the sender's stop (300 ms) and room for a busy machine; below a close that
	// waits the default (DefaultTimeout, 2 s, and the sender's stop) or for the stalled agent.
	if took := time.Since(started); took > 1800*time.Millisecond {
		t.Errorf("close took %v", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("close: %v", err)
	}
	closed := c.Stats().Dropped[DropClosed]["info"]
	if closed == 0 {
		t.Errorf("what was still queued is counted: %+v", c.Stats())
	}
	log.Info("after close")
	if got := c.Stats().Dropped[DropClosed]["info"]; got != closed+1 {
		t.Errorf("a record after Close is counted closed: %d, then %d", closed, got)
	}
	if summary := notices.take(); strings.Count(summary, "\n") != 1 || !strings.Contains(summary, "sluice: closed;") ||
		!strings.Contains(summary, "closed=") {
		t.Errorf("one summary line: %q", summary)
	}
}

func TestCloseWithAnAgentThatNeverAcknowledgesCountsUnconfirmed(t *testing.T) {
	path := socketPath(t)
	agent := newFakeAgent(t, path)
	agent.holdAcks.Store(true)
	if err := agent.start(); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, path, WithAcknowledged(true))
	log := newLogger(c, nil)
	for i := 0; i < 10; i++ {
		log.Info("never acknowledged")
	}
	if !agent.waitForLines(10) {
		t.Fatal("the records did not arrive")
	}
	started := time.Now()
	if err := c.Close(timeout(300 * time.Millisecond)); err == nil {
		t.Error("close says it stopped waiting")
	}
	if took := time.Since(started); took > 1800*time.Millisecond {
		t.Errorf("close took %v", took)
	}
	if s := c.Stats(); s.Unconfirmed != 10 || s.DroppedTotal != 0 || s.Unacknowledged != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestCloseWithoutADeadlineWaitsTheDefaultAtMost(t *testing.T) {
	c := newClient(t, socketPath(t)) // no agent at all
	newLogger(c, nil).Info("never delivered")
	started := time.Now()
	if err := c.Close(context.Background()); err == nil {
		t.Error("close says it stopped waiting")
	}
	if took := time.Since(started); took < DefaultTimeout || took > DefaultTimeout+1500*time.Millisecond {
		t.Errorf("close took %v", took)
	}
	if s := c.Stats(); s.Dropped[DropClosed]["info"] != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestCloseDoesNotWaitAgainForAnAgentThatTookNothingSinceAFlush(t *testing.T) {
	c := newClient(t, socketPath(t)) // no agent at all
	newLogger(c, nil).Info("never delivered")
	started := time.Now()
	if err := c.Flush(timeout(300 * time.Millisecond)); err == nil {
		t.Error("flush cannot succeed without an agent")
	}
	c.Close(timeout(5 * time.Second))
	// A close that waited again would take its 5 s.
	if took := time.Since(started); took > 4*time.Second {
		t.Errorf("flush and close took %v", took)
	}
}

func TestCloseIsQuietWhenNothingWasLostAndSecondCloseDoesNothing(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	notices := &lockedBuffer{}
	c := newClient(t, path, WithNoticeOutput(notices))
	newLogger(c, nil).Info("delivered")
	if err := c.Close(timeout(5 * time.Second)); err != nil {
		t.Errorf("close: %v", err)
	}
	agent.expect(t, 1)
	if err := c.Close(timeout(time.Second)); err != nil {
		t.Errorf("second close: %v", err)
	}
	if got := notices.take(); got != "" {
		t.Errorf("notices %q", got)
	}
}

func TestNewRefusesInvalidOptions(t *testing.T) {
	for name, opt := range map[string]Option{
		"no records":           WithMaxQueueRecords(0),
		"no bytes":             WithMaxQueueBytes(0),
		"tiny records":         WithMaxRecordSize(10),
		"a fraction above one": WithDropBelowWarnAt(1.5),
		"a zero fraction":      WithDropBelowWarnAt(0),
	} {
		if _, err := New("", opt); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestAnEmptySocketPathIsSluiceSocketWhenSetElseTheChartsPath(t *testing.T) {
	t.Setenv(SocketEnv, "/tmp/from-the-pod-spec.sock")
	fromEnv, err := New("")
	if err != nil {
		t.Fatal(err)
	}
	defer fromEnv.Close(context.Background())
	t.Setenv(SocketEnv, "")
	fallback, err := New("")
	if err != nil {
		t.Fatal(err)
	}
	defer fallback.Close(context.Background())
	if fromEnv.path != "/tmp/from-the-pod-spec.sock" || fallback.path != DefaultSocketPath {
		t.Fatalf("socket paths %q and %q", fromEnv.path, fallback.path)
	}
}
