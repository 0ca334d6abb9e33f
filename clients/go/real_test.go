package sluice

// The client against the real agent binary (SLUICE_BIN) shipping to a real Kafka
// (SLUICE_TEST_KAFKA); skipped when SLUICE_BIN is not set. What the agent did is read from its
// Prometheus metrics: records read (sluice_ingest_records_total), refused at the socket
// (…_rejected_total) and acknowledged by Kafka (sluice_ship_records_delivered_total). Counters
// start from zero in each agent process.

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestRecordsLoggedThroughSlogAndTheWriterAreDeliveredToKafkaByTheRealAgent(t *testing.T) {
	path := socketPath(t)
	// The listener and the client share a small max_record_size, so that the client's cutting
	// meets the agent's own limit.
	agent := newRealAgent(t, path, realAgentOptions{maxRecordSize: "64 KiB"})
	agent.start()
	c := newClient(t, path, WithMaxRecordSize(64<<10))
	log := newLogger(c, &HandlerOptions{Logger: "real", Fields: map[string]any{"service": "checkout"}})
	const n = 500

	for i := 0; i < n-5; i++ {
		log.Info("order paid", "order_id", i, "amount", float64(i)*1.5, "tags", []string{"a", "b"}, "level", "x")
	}
	log.Error("payment failed", "err", fmt.Errorf("while paying: %w", errors.New("the root cause")))
	// What the agent refuses (a NUL, bytes that are not UTF-8) the client repairs.
	log.Warn("a NUL \x00 and a byte that is not UTF-8 \xff", "raw", []byte("\xff\xfe not utf-8"))
	// Longer than max_record_size: the client cuts it, so the agent does not refuse it as too_large.
	log.Error(strings.Repeat("x", 200<<10), "big", strings.Repeat("y", 100<<10))
	w := c.Writer()
	fmt.Fprintln(w, `{"level":"info","ts":1767225600.5,"msg":"from zap, with an escaped NUL \u0000"}`)
	fmt.Fprintln(w, "2026/01/01 00:00:00 a plain line from the log package")
	if err := c.Close(timeout(10 * time.Second)); err != nil {
		t.Fatalf("close: %v; stats %+v", err, c.Stats())
	}

	s := c.Stats()
	if s.Sent != n || s.DroppedTotal != 0 || s.Replaced != 2 || s.Truncated != 1 {
		t.Errorf("stats %+v", s)
	}
	expected := float64(n + s.ReportsSent) // in-band drop reports: none without drops
	m := agent.waitForMetrics(func(m metrics) bool { return m.total(metricDelivered) >= expected }, 30*time.Second)
	if got := m.total(metricIngested); got != expected {
		t.Errorf("the agent read %v records of %v; log:\n%s", got, expected, agent.logTail())
	}
	if got := m.total(metricDelivered); got != expected {
		t.Errorf("Kafka acknowledged %v of %v", got, expected)
	}
	if lost := m.lost(); len(lost) > 0 {
		t.Errorf("the agent lost records: %v; log:\n%s", lost, agent.logTail())
	}
}

func TestAcknowledgedModeWithADiskBufferEveryRecordIsAcknowledgedOrCountedAcrossAnAgentSIGKILL(t *testing.T) {
	path := socketPath(t)
	agent := newRealAgent(t, path, realAgentOptions{buffer: "disk", ackPoint: "spooled"})
	agent.start()
	c := newClient(t, path, WithAcknowledged(true))
	log := newLogger(c, nil)
	var logged atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // a steady writer, as a server logs
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			log.Info("record", "seq", logged.Load())
			logged.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	stopWriter := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the writer did not stop: a logging call is blocked")
		}
	}
	defer stopWriter()

	if !waitUntil(func() bool { return c.Stats().Acknowledged >= 500 }, 30*time.Second) {
		t.Fatalf("stats %+v", c.Stats())
	}
	if ackPoint := c.Stats().AckPoint; ackPoint != "spooled" {
		t.Errorf("ack point %q", ackPoint)
	}
	// Kill while records are sent and not yet acknowledged, so that they must be sent again: the
	// agent is frozen first, so what is written meanwhile waits for its ACK.
	agent.freeze()
	if !waitUntil(func() bool { return c.Stats().Unacknowledged > 0 }, 5*time.Second) {
		t.Fatalf("nothing awaits an ACK: %+v", c.Stats())
	}
	agent.kill() // SIGKILL: no drain; what it spooled and acknowledged must survive
	// The ACK reader reads what the dead agent left in the socket, then loses the connection:
	// from then until the restart, nothing more can be acknowledged.
	if !waitUntil(func() bool { return !c.Stats().Connected }, 10*time.Second) {
		t.Fatalf("stats %+v", c.Stats())
	}
	acknowledgedByTheFirst := c.Stats().Acknowledged
	time.Sleep(500 * time.Millisecond) // records keep coming, and queue
	agent.start()                      // same socket, same spool
	restartedAt := uint64(logged.Load())
	if !waitUntil(func() bool { return c.Stats().Acknowledged >= restartedAt+300 }, 30*time.Second) {
		t.Fatalf("stats %+v", c.Stats())
	}
	stopWriter()

	flush(t, c, 30*time.Second)
	s := c.Stats()
	total := uint64(logged.Load())
	var refused uint64
	for _, count := range s.NAK {
		refused += count
	}
	if accounted := s.Acknowledged + s.DroppedTotal + refused; accounted != total {
		t.Errorf("%d logged, %d accounted for: %+v", total, accounted, s)
	}
	if s.Queued != 0 || s.Unacknowledged != 0 || s.Unconfirmed != 0 || s.Reconnects < 1 {
		t.Errorf("stats %+v", s)
	}
	if float64(s.Acknowledged) < 0.9*float64(total) {
		t.Errorf("%d of %d acknowledged: %+v", s.Acknowledged, total, s)
	}
	// What was not acknowledged before the kill was sent again to the new agent.
	if s.Sent <= total {
		t.Errorf("%d sent for %d logged: nothing was sent again", s.Sent, total)
	}
	t.Logf("%d logged, %d sent (%d again), %d acknowledged, %d dropped, %d acknowledged by the first agent",
		total, s.Sent, s.Sent-total, s.Acknowledged, s.DroppedTotal, acknowledgedByTheFirst)

	// The second agent delivers what it read and what it found in the spool (records the first
	// one spooled; some may be in Kafka already: duplicates are allowed here, losses not — the
	// persister keeps one row per record id).
	acknowledgedByTheSecond := float64(s.Acknowledged - acknowledgedByTheFirst)
	m := agent.waitForMetrics(func(m metrics) bool {
		return m.total(metricDelivered) >= m.total(metricIngested)+m.total(metricRecovered) &&
			m.total(metricIngested) >= acknowledgedByTheSecond
	}, 30*time.Second)
	ingested, recovered, delivered := m.total(metricIngested), m.total(metricRecovered), m.total(metricDelivered)
	if ingested < acknowledgedByTheSecond {
		t.Errorf("the second agent read %v records and acknowledged %v", ingested, acknowledgedByTheSecond)
	}
	if delivered != ingested+recovered {
		t.Errorf("delivered %v, read %v, recovered %v; log:\n%s", delivered, ingested, recovered, agent.logTail())
	}
	if lost := m.lost(); len(lost) > 0 {
		t.Errorf("the agent lost records: %v; log:\n%s", lost, agent.logTail())
	}
}

func TestTheLoggingCallKeepsReturningWhileTheAgentIsStoppedAndRecordsFlowAgainAfterItRestarts(t *testing.T) {
	path := socketPath(t)
	agent := newRealAgent(t, path, realAgentOptions{})
	agent.start()
	const bound = 500
	c := newClient(t, path, WithMaxQueueRecords(bound))
	log := newLogger(c, nil)
	for i := 0; i < 10; i++ {
		log.Info("before the stop", "i", i)
	}
	flush(t, c, 10*time.Second)
	if got := agent.waitForMetrics(func(m metrics) bool { return m.total(metricDelivered) >= 10 }, 30*time.Second).total(metricDelivered); got != 10 {
		t.Fatalf("delivered %v", got)
	}

	if code := agent.terminate(); code != 0 {
		t.Fatalf("the agent exited %d; log:\n%s", code, agent.logTail())
	}
	const calls = 2000
	slowest, took := slowestCall(calls, func(i int) { log.Info("while the agent is stopped", "i", i) })
	if slowest > maxCallPause || took > 10*time.Second {
		t.Errorf("%d calls took %v, the slowest %v, with the agent stopped", calls, took, slowest)
	}
	s := c.Stats()
	if s.Sent != 10 || s.DroppedTotal < calls-bound {
		t.Errorf("stats %+v", s)
	}
	for reason := range s.Dropped {
		if reason != DropFull && reason != DropHighWater {
			t.Errorf("dropped for %s: %+v", reason, s)
		}
	}
	dropped := s.DroppedTotal

	agent.start() // a new process: its counters start from zero
	flush(t, c, 15*time.Second)
	for i := 0; i < 100; i++ {
		log.Info("after the restart", "i", i)
	}
	if err := c.Close(timeout(10 * time.Second)); err != nil {
		t.Fatalf("close: %v", err)
	}

	s = c.Stats()
	if s.DroppedTotal != dropped || s.Queued != 0 || s.Sent+dropped != 10+calls+100 {
		t.Errorf("nothing dropped once the agent was back: %+v", s)
	}
	if s.ReportsSent < 1 {
		t.Errorf("the drops were not reported in band when the agent was back: %+v", s)
	}
	expected := float64(s.Sent - 10 + s.ReportsSent) // the queued ones, the report, the new ones
	m := agent.waitForMetrics(func(m metrics) bool { return m.total(metricDelivered) >= expected }, 30*time.Second)
	if got := m.total(metricIngested); got != expected {
		t.Errorf("the agent read %v records of %v; log:\n%s", got, expected, agent.logTail())
	}
	if got := m.total(metricDelivered); got != expected {
		t.Errorf("Kafka acknowledged %v of %v", got, expected)
	}
	if lost := m.lost(); len(lost) > 0 {
		t.Errorf("the agent lost records: %v; log:\n%s", lost, agent.logTail())
	}
}
