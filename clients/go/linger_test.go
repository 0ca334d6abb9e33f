package sluice

import (
	"log/slog"
	"testing"
	"time"
)

// woken takes the sender's wake-up if there is one.
func woken(q *queue) bool {
	select {
	case <-q.wake:
		return true
	default:
		return false
	}
}

func offerLine(q *queue, text string) {
	q.offer([]byte(text+"\n"), slog.LevelInfo, false, false, 0)
}

func TestTheLingerIsWokenByTheRecordThatReachesHalfABatch(t *testing.T) {
	q := newQueue(1000, 1<<20, 1)
	offerLine(q, "first")
	if !q.startLinger(3, 1<<20) {
		t.Fatal("a linger starts below the mark")
	}
	offerLine(q, "second")
	if woken(q) {
		t.Fatal("a record below the mark wakes nobody")
	}
	offerLine(q, "third")
	if !woken(q) {
		t.Fatal("the record that reaches the mark wakes the sender")
	}
	q.endLinger()
	if q.startLinger(3, 1<<20) {
		t.Fatal("no linger once the mark is reached")
	}
}

func TestTheLingerIsWokenByTheBytesReachingTheirMark(t *testing.T) {
	q := newQueue(1000, 1<<20, 1)
	offerLine(q, "first")
	if !q.startLinger(1000, 100) {
		t.Fatal("a linger starts below the mark")
	}
	offerLine(q, string(make([]byte, 100)))
	if !woken(q) {
		t.Fatal("the record that reaches the byte mark wakes the sender")
	}
}

func TestAFlushEndsTheLingerAndNoneStartsWhileItWaits(t *testing.T) {
	q := newQueue(1000, 1<<20, 1)
	offerLine(q, "waiting")
	if !q.startLinger(1000, 1<<20) {
		t.Fatal("a linger starts below the mark")
	}
	done := make(chan struct{})
	settled := make(chan bool)
	go func() { settled <- q.waitSettled(done) }()
	if !waitUntil(func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.flushers > 0
	}, 5*time.Second) {
		t.Fatal("the flush did not start waiting")
	}
	if !woken(q) {
		t.Fatal("a flush wakes the lingering sender")
	}
	q.endLinger()
	if q.startLinger(1000, 1<<20) {
		t.Fatal("no linger while a flush waits")
	}
	close(done)
	if <-settled {
		t.Fatal("nothing was sent: the flush cannot have succeeded")
	}
	if !q.startLinger(1000, 1<<20) {
		t.Fatal("a linger starts again once no flush waits")
	}
}

func TestBytesAwaitingAnAcknowledgementDoNotCountTowardTheLingerMark(t *testing.T) {
	q := newQueue(1000, 1<<20, 1)
	gen := q.connectionOpened("spooled", false)
	offerLine(q, string(make([]byte, 100)))
	offerLine(q, string(make([]byte, 100)))
	if sent := q.takeNumbered(nil, gen, 1000, 1<<20); len(sent) != 2 {
		t.Fatalf("sent %d, want 2", len(sent))
	}
	offerLine(q, "waiting")
	if !q.startLinger(1000, 150) {
		t.Fatal("only what waits to be sent counts toward the mark, not what awaits its ACK")
	}
}
