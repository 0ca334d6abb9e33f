package sluice

// The logging call never waits: a full queue drops the incoming record, counted and reported.

import (
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestTheLoggingCallReturnsAndNeverFailsWhenTheAgentIsAbsent(t *testing.T) {
	c := newClient(t, socketPath(t)) // nothing listens on the path: every dial fails with ENOENT
	log := newLogger(c, nil)
	const calls = 10_000
	slowest, took := slowestCall(calls, func(i int) { log.Info("record", "i", i) })
	if slowest > maxCallPause || took > 10*time.Second {
		t.Errorf("%d calls took %v, the slowest %v: the call waits for something", calls, took, slowest)
	}

	s := c.Stats()
	fraction := DefaultDropBelowWarnAt
	high := int(DefaultMaxQueueRecords * fraction)
	if s.Queued != high {
		t.Errorf("queued %d, want %d: the high-water tier keeps the last 20%% for warnings", s.Queued, high)
	}
	want := map[DropReason]map[string]uint64{DropHighWater: {"info": uint64(calls - high)}}
	if !reflect.DeepEqual(s.Dropped, want) || s.Sent != 0 || s.Connected {
		t.Errorf("stats %+v", s)
	}
	if !waitUntil(func() bool { return c.Stats().LastError == "ENOENT" }, 5*time.Second) {
		t.Errorf("last error %q", c.Stats().LastError)
	}
}

func TestTheLoggingCallReturnsWhileTheAgentIsStalled(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path, WithMaxQueueBytes(1<<20))
	log := newLogger(c, nil)
	log.Info("connect first")
	agent.expect(t, 1)
	agent.stall()

	payload := strings.Repeat("p", 1000)
	const calls = 5_000 // 5 MB: far more than the socket buffers hold
	var wg sync.WaitGroup
	slowests := make([]time.Duration, 4)
	started := time.Now()
	for g := 0; g < 4; g++ { // several goroutines, as a server's handlers would
		wg.Add(1)
		go func() {
			defer wg.Done()
			slowests[g], _ = slowestCall(calls/4, func(int) { log.Info(payload) })
		}()
	}
	wg.Wait()
	if took, slowest := time.Since(started), slices.Max(slowests); slowest > maxCallPause || took > 10*time.Second {
		t.Errorf("%d calls took %v, the slowest %v, with the agent stalled", calls, took, slowest)
	}
	s := c.Stats()
	// Queued may hold the in-band report of the drops, too.
	if accounted := s.Queued + int(s.DroppedTotal) + int(s.Sent); s.DroppedTotal == 0 || accounted < calls+1 || accounted > calls+2 {
		t.Errorf("every record is queued, sent or counted: %+v", s)
	}

	agent.resume() // what was queued goes, and the report of the drops with it
	flush(t, c, 10*time.Second)
	s = c.Stats()
	want := int(s.Sent + s.ReportsSent)
	got := agent.expect(t, want)
	if len(got) != want || s.ReportsSent < 1 || s.Queued != 0 {
		t.Errorf("%d records arrived, %+v", len(got), s)
	}
	// One report, or more when drops went on after the first found room: together they tell
	// every drop.
	reported := 0.0
	for _, record := range got {
		if record["sluice.client"] == "dropped" {
			reported += record["count"].(float64)
		}
	}
	if reported != float64(s.DroppedTotal) {
		t.Errorf("the reports tell %v drops of %d", reported, s.DroppedTotal)
	}
}

func TestDropsAreCountedByReasonAndLevelWhenTheQueueIsFull(t *testing.T) {
	c := newClient(t, socketPath(t), WithMaxQueueRecords(10), WithDropBelowWarnAt(1))
	log := newLogger(c, nil)
	for i := 0; i < 8; i++ {
		log.Info("fills")
	}
	for i := 0; i < 4; i++ {
		log.Error("two fit, two do not")
	}
	log.Debug("does not fit")

	s := c.Stats()
	want := map[DropReason]map[string]uint64{DropFull: {"error": 2, "debug": 1}}
	if s.Queued != 10 || s.DroppedTotal != 3 || !reflect.DeepEqual(s.Dropped, want) {
		t.Errorf("stats %+v", s)
	}
}

func TestRecordsBelowWarnAreDroppedFirstAboveTheHighWaterMark(t *testing.T) {
	c := newClient(t, socketPath(t), WithMaxQueueRecords(10), WithDropBelowWarnAt(0.5))
	log := newLogger(c, nil)
	for i := 0; i < 7; i++ {
		log.Info("only five fit below warn")
	}
	for i := 0; i < 6; i++ {
		log.Warn("five more fit")
	}
	s := c.Stats()
	want := map[DropReason]map[string]uint64{DropHighWater: {"info": 2}, DropFull: {"warn": 1}}
	if s.Queued != 10 || !reflect.DeepEqual(s.Dropped, want) {
		t.Errorf("stats %+v", s)
	}
}

func TestTheQueueIsBoundedByBytesAsWellAsRecords(t *testing.T) {
	c := newClient(t, socketPath(t), WithMaxQueueBytes(10_000), WithDropBelowWarnAt(1))
	log := newLogger(c, nil)
	for i := 0; i < 100; i++ {
		log.Error(strings.Repeat("x", 900))
	}
	s := c.Stats()
	if s.QueuedBytes > 10_000 || s.Queued >= 11 || s.Dropped[DropFull]["error"] != uint64(100-s.Queued) {
		t.Errorf("stats %+v", s)
	}
}

func TestTheDroppedRecordArrivesInBandOnceTheAgentIsBack(t *testing.T) {
	path := socketPath(t)
	c := newClient(t, path, WithMaxQueueRecords(5), WithDropBelowWarnAt(1))
	log := newLogger(c, nil)
	for i := 0; i < 8; i++ {
		if i%2 == 0 {
			log.Error("record", "i", i)
		} else {
			log.Info("record", "i", i)
		}
	}
	if c.Stats().DroppedTotal != 3 {
		t.Fatalf("stats %+v", c.Stats())
	}

	agent := startFakeAgent(t, path)
	records := agent.expect(t, 6)
	for i, r := range records[:5] {
		if r["i"] != float64(i) {
			t.Errorf("record %d: %v", i, r)
		}
	}
	report := records[5]
	if report["sluice.client"] != "dropped" || report["count"] != float64(3) || report["level"] != "warn" ||
		!strings.HasSuffix(report["since"].(string), "Z") {
		t.Errorf("report %v", report)
	}
	if !reflect.DeepEqual(report["by_reason"], map[string]any{"full": float64(3)}) ||
		!reflect.DeepEqual(report["by_level"], map[string]any{"info": float64(2), "error": float64(1)}) {
		t.Errorf("report %v", report)
	}
	// The sender counts a write once it returns, a moment after the agent may have read it.
	if !waitUntil(func() bool { s := c.Stats(); return s.ReportsSent == 1 && s.Sent == 5 }, 5*time.Second) {
		t.Errorf("stats %+v", c.Stats())
	}

	log.Info("after")
	flush(t, c, 5*time.Second)
	if records := agent.expect(t, 7); records[6]["message"] != "after" {
		t.Errorf("reported once: %v", records[6])
	}
}

func TestDropsAreNoticedOnTheNoticeOutputAtMostOnceAMinute(t *testing.T) {
	notices := &lockedBuffer{}
	c := newClient(t, socketPath(t), WithMaxQueueRecords(1), WithDropBelowWarnAt(1), WithNoticeOutput(notices))
	var mu sync.Mutex
	now := time.Now()
	c.q.mu.Lock()
	c.q.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	c.q.mu.Unlock()
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	log := newLogger(c, nil)

	log.Info("queued")
	log.Info("dropped, noticed")
	var line string
	if !waitUntil(func() bool { line += notices.take(); return line != "" }, 5*time.Second) {
		t.Fatal("the first drop is noticed at once")
	}
	if !strings.HasPrefix(line, "sluice: dropped 1 log record(s)") || !strings.Contains(line, "full=1") ||
		!strings.Contains(line, "not connected (") || strings.Count(line, "\n") != 1 {
		t.Errorf("notice %q", line)
	}

	for i := 0; i < 50; i++ {
		log.Info("dropped within the minute")
	}
	time.Sleep(100 * time.Millisecond)
	advance(59 * time.Second)
	time.Sleep(100 * time.Millisecond)
	if got := notices.take(); got != "" {
		t.Errorf("within the minute: %q", got)
	}
	advance(time.Second)
	log.Info("one more")
	c.q.mu.Lock()
	c.q.wakeSender() // as its timer would, a real minute later
	c.q.mu.Unlock()
	if !waitUntil(func() bool { line = notices.take(); return line != "" }, 5*time.Second) {
		t.Fatal("no notice after the minute")
	}
	if !strings.HasPrefix(line, "sluice: dropped 51 log record(s)") || !strings.Contains(line, "full=52") {
		t.Errorf("notice %q", line)
	}
}

// The high-water decision uses the level of what is written: slog's, or the level field of a
// JSON line written to the Writer.
func TestTheWritersRecordsAreDroppedByTheirLevelToo(t *testing.T) {
	c := newClient(t, socketPath(t), WithMaxQueueRecords(4), WithDropBelowWarnAt(0.5))
	w := c.Writer()
	for _, line := range []string{
		`{"level":"info","msg":"a"}`, `{"level":"debug","msg":"b"}`, `{"level":"info","msg":"dropped"}`,
		`{"level":"warn","msg":"c"}`, "plain text is info", `{"level":"error","msg":"d"}`, `{"level":50,"msg":"full"}`,
	} {
		if n, err := w.Write([]byte(line + "\n")); n != len(line)+1 || err != nil {
			t.Fatalf("write: %d, %v", n, err)
		}
	}
	want := map[DropReason]map[string]uint64{DropHighWater: {"info": 2}, DropFull: {"error": 1}}
	if s := c.Stats(); s.Queued != 4 || !reflect.DeepEqual(s.Dropped, want) {
		t.Errorf("stats %+v", s)
	}
}
