package sluice

// Reconnecting, and acknowledged mode: resend what was not acknowledged, count NAKs.

import (
	"bytes"
	"net"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestTheSenderConnectsWhenTheAgentAppearsLater(t *testing.T) {
	path := socketPath(t)
	c := newClient(t, path)
	newLogger(c, nil).Info("before the agent")
	if !waitUntil(func() bool { return c.Stats().LastError == "ENOENT" }, 5*time.Second) {
		t.Fatalf("stats %+v", c.Stats())
	}

	agent := startFakeAgent(t, path)
	if got := agent.expect(t, 1)[0]["message"]; got != "before the agent" {
		t.Errorf("message %v", got)
	}
	if s := c.Stats(); s.Reconnects != 0 || s.LastError != "" || !s.Connected {
		t.Errorf("stats %+v", s)
	}
}

func TestAStaleSocketFileIsRetriedLikeAMissingOne(t *testing.T) {
	path := socketPath(t)
	// Bound, never listening: connect gets ECONNREFUSED, as after an agent's SIGKILL.
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, path)
	newLogger(c, nil).Info("waits for the agent")
	if !waitUntil(func() bool { return c.Stats().LastError == "ECONNREFUSED" }, 5*time.Second) {
		t.Fatalf("stats %+v", c.Stats())
	}
	syscall.Close(fd)
	os.Remove(path)

	agent := startFakeAgent(t, path)
	if got := agent.expect(t, 1)[0]["message"]; got != "waits for the agent" {
		t.Errorf("message %v", got)
	}
}

func TestTheSenderReconnectsAfterTheAgentRestarts(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	log := newLogger(c, nil)
	log.Info("first")
	agent.expect(t, 1)

	agent.stop()
	for i := 0; i < 5; i++ {
		log.Info("during the restart", "i", i) // queued; the first write after the stop fails
	}
	time.Sleep(100 * time.Millisecond)
	if err := agent.start(); err != nil {
		t.Fatal(err)
	}

	agent.expect(t, 6)
	if got := strings.Join(agent.messages(t), ","); got != "first"+strings.Repeat(",during the restart", 5) {
		t.Errorf("messages %s", got)
	}
	if s := c.Stats(); s.Reconnects < 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestBackoffGrowsWithJitterUpToItsCapAndResets(t *testing.T) {
	b := newBackoff()
	var delays []time.Duration
	for i := 0; i < 12; i++ {
		delays = append(delays, b.delay())
	}
	if delays[0] < 10*time.Millisecond || delays[0] > 20*time.Millisecond {
		t.Errorf("first delay %v", delays[0])
	}
	for _, d := range delays {
		if d > 2*time.Second {
			t.Errorf("delay %v over the cap", d)
		}
	}
	if last := delays[len(delays)-1]; last < time.Second {
		t.Errorf("last delay %v", last)
	}
	b.reset()
	if d := b.delay(); d > 20*time.Millisecond {
		t.Errorf("after a reset %v", d)
	}
}

// threeUnacknowledgedThenTheAgentRestarts: an acknowledged client logs three records the agent
// never acknowledges; the agent restarts (the connection is lost) and acknowledges from then on.
func threeUnacknowledgedThenTheAgentRestarts(t *testing.T, nak func(uint64, []byte) string, beforeRestart func(*Client)) (*fakeAgent, *Client) {
	path := socketPath(t)
	agent := newFakeAgent(t, path)
	agent.nak = nak
	agent.holdAcks.Store(true)
	if err := agent.start(); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, path, WithAcknowledged(true))
	log := newLogger(c, nil)
	for i := 0; i < 3; i++ {
		log.Info("unacknowledged", "i", i)
	}
	if !agent.waitFor(func(a *fakeAgent) bool { return len(a.lines)+len(a.rejected) >= 3 }, 5*time.Second) {
		t.Fatal("the three records did not arrive")
	}
	if beforeRestart != nil {
		beforeRestart(c)
	}
	agent.stop() // the ACKs never come: the connection is lost
	if !waitUntil(func() bool { return !c.Stats().Connected }, 5*time.Second) {
		t.Fatal("the client did not see the connection end")
	}
	agent.holdAcks.Store(false)
	if err := agent.start(); err != nil {
		t.Fatal(err)
	}
	log.Info("after the restart")
	return agent, c
}

func TestAckModeResendsUnacknowledgedRecordsAfterAReconnect(t *testing.T) {
	agent, c := threeUnacknowledgedThenTheAgentRestarts(t, nil, func(c *Client) {
		if s := c.Stats(); s.Unacknowledged != 3 || s.AckPoint != "spooled" {
			t.Errorf("stats %+v", s)
		}
		if err := c.Flush(timeout(200 * time.Millisecond)); err == nil {
			t.Error("flush waits for the ACKs in acknowledged mode")
		}
	})
	flush(t, c, 5*time.Second)

	want := "unacknowledged,unacknowledged,unacknowledged"
	if got := strings.Join(agent.messages(t), ","); got != want+","+want+",after the restart" {
		t.Errorf("messages %s", got)
	}
	s := c.Stats()
	if s.Acknowledged != 4 || s.Unacknowledged != 0 || s.Sent != 7 || s.Reconnects != 1 || s.AckPoint != "spooled" {
		t.Errorf("stats %+v (three of them sent twice)", s)
	}
}

func TestAResendIsTheSameSessionNumberAndTimeSoTheAgentStoresItOnce(t *testing.T) {
	agent, c := threeUnacknowledgedThenTheAgentRestarts(t, nil, nil)
	flush(t, c, 5*time.Second)

	_, sessions, numbered, _ := agent.snapshot()
	if len(sessions) != 2 || sessions[0] != (sessionStart{c.Session(), 1}) || sessions[1] != (sessionStart{c.Session(), 1}) {
		t.Fatalf("sessions %v: the same session, from the first unacknowledged", sessions)
	}
	sends := map[uint64]map[numberedLine]bool{}
	for _, line := range numbered {
		if sends[line.n] == nil {
			sends[line.n] = map[numberedLine]bool{}
		}
		sends[line.n][line] = true
	}
	if len(sends) != 4 {
		t.Errorf("numbers %v", sends)
	}
	for n, lines := range sends {
		if len(lines) != 1 {
			t.Errorf("record %d was sent differently: %v", n, lines)
		}
	}
	if len(numbered) != 7 {
		t.Errorf("%d sends", len(numbered))
	}
	if session := c.Session(); len(session) != 32 || session[12] != '7' || !strings.ContainsRune("89ab", rune(session[16])) {
		t.Errorf("session %s is not a UUIDv7", session)
	}
}

func TestARefusedRecordKeepsItsPlaceUntilAcknowledgedSoResentNumbersStayConsecutive(t *testing.T) {
	refuse := func(_ uint64, line []byte) string {
		if bytes.Contains(line, []byte(`"i":1`)) {
			return "rate_limited"
		}
		return ""
	}
	agent, c := threeUnacknowledgedThenTheAgentRestarts(t, refuse, waitForTheNAK(t))
	flush(t, c, 5*time.Second)

	_, _, numbered, _ := agent.snapshot()
	var resent []uint64
	for _, line := range numbered[3:] {
		resent = append(resent, line.n)
	}
	if !reflect.DeepEqual(resent, []uint64{1, 2, 3, 4}) {
		t.Errorf("numbers after the reconnect %v", resent)
	}
	s := c.Stats()
	if !reflect.DeepEqual(s.NAK, map[string]uint64{"rate_limited": 1}) || s.Acknowledged != 3 || s.Unacknowledged != 0 {
		t.Errorf("refused twice, counted once: %+v", s)
	}
}

// waitForTheNAK waits until the client heard a NAK for a record still awaiting its ACK (the
// agent sent it; the client reads it on its own time).
func waitForTheNAK(t *testing.T) func(*Client) {
	return func(c *Client) {
		heard := func() bool {
			c.q.mu.Lock()
			defer c.q.mu.Unlock()
			for i := 0; i < c.q.inflight; i++ {
				if c.q.at(i).refused != "" {
					return true
				}
			}
			return false
		}
		if !waitUntil(heard, 5*time.Second) {
			t.Fatal("the client did not hear the NAK")
		}
	}
}

func TestARefusedRecordSentAgainAfterAReconnectIsCountedByItsLastAnswer(t *testing.T) {
	// Refused on the first connection, whose covering ACK never came; sent again (the numbers
	// stay consecutive) and taken by the next agent: one row, so it is acknowledged, not a NAK.
	path := socketPath(t)
	first := newFakeAgent(t, path)
	first.nak = func(_ uint64, line []byte) string {
		if bytes.Contains(line, []byte("refuse me")) {
			return "rate_limited"
		}
		return ""
	}
	first.holdAcks.Store(true)
	if err := first.start(); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, path, WithAcknowledged(true))
	log := newLogger(c, nil)
	for _, message := range []string{"keep 1", "refuse me", "keep 2"} {
		log.Info(message)
	}
	if !first.waitFor(func(a *fakeAgent) bool { return len(a.lines)+len(a.rejected) >= 3 }, 5*time.Second) {
		t.Fatal("the three records did not arrive")
	}
	waitForTheNAK(t)(c)
	first.stop()
	second := newFakeAgent(t, path) // takes everything
	if err := second.start(); err != nil {
		t.Fatal(err)
	}
	flush(t, c, 5*time.Second)
	s := c.Stats()
	if len(s.NAK) != 0 || s.Acknowledged != 3 || s.Unacknowledged != 0 || s.Unconfirmed != 0 {
		t.Errorf("its last answer was an ACK: %+v", s)
	}
}

func TestAckModeCountsNAKsByReasonAndDoesNotSendThemAgain(t *testing.T) {
	path := socketPath(t)
	agent := newFakeAgent(t, path)
	agent.nak = func(_ uint64, line []byte) string {
		if bytes.Contains(line, []byte("refuse me")) {
			return "rate_limited"
		}
		return ""
	}
	if err := agent.start(); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, path, WithAcknowledged(true))
	log := newLogger(c, nil)
	for _, message := range []string{"keep 1", "refuse me", "keep 2", "refuse me"} {
		log.Info(message)
	}
	flush(t, c, 5*time.Second)
	s := c.Stats()
	if !reflect.DeepEqual(s.NAK, map[string]uint64{"rate_limited": 2}) || s.Acknowledged != 2 || s.Unacknowledged != 0 || s.QueuedBytes != 0 {
		t.Errorf("stats %+v", s)
	}

	agent.restart(t)
	log.Info("keep 3")
	flush(t, c, 5*time.Second)
	if got := strings.Join(agent.messages(t), ","); got != "keep 1,keep 2,keep 3" {
		t.Errorf("messages %s", got)
	}
	if _, _, _, rejected := agent.snapshot(); len(rejected) != 2 {
		t.Errorf("NAK'd records are not sent again: %d refusals", len(rejected))
	}
}

func TestAckModeNeverEvictsRecordsAwaitingAcknowledgement(t *testing.T) {
	path := socketPath(t)
	agent := newFakeAgent(t, path)
	agent.holdAcks.Store(true)
	if err := agent.start(); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, path, WithAcknowledged(true), WithMaxQueueRecords(4), WithDropBelowWarnAt(1))
	log := newLogger(c, nil)
	for i := 0; i < 4; i++ {
		log.Error("awaiting ack", "i", i)
	}
	if !agent.waitForLines(4) {
		t.Fatal("the records did not arrive")
	}
	log.Error("no room: sent records still count")
	s := c.Stats()
	if s.Unacknowledged != 4 || !reflect.DeepEqual(s.Dropped, map[DropReason]map[string]uint64{DropFull: {"error": 1}}) {
		t.Errorf("stats %+v", s)
	}

	agent.holdAcks.Store(false)
	flush(t, c, 5*time.Second)
	log.Error("room again")
	flush(t, c, 5*time.Second)
	records := agent.records(t)
	if got := strings.Join(agent.messages(t), ","); got != strings.Repeat("awaiting ack,", 4)+"room again" {
		t.Errorf("messages %s", got)
	}
	if records[len(records)-2]["sluice.client"] != "dropped" && records[len(records)-1]["sluice.client"] != "dropped" {
		t.Errorf("the drop is reported in band: %v", records)
	}
}

func TestAckModeReconnectsWhenTheAgentAnswersWhatIsNotTheProtocol(t *testing.T) {
	path := socketPath(t)
	agent := newFakeAgent(t, path)
	agent.ackPoint = "spooled extra words" // "OK spooled extra words": not an answer this client knows
	if err := agent.start(); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, path, WithAcknowledged(true))
	newLogger(c, nil).Info("waits")
	if !waitUntil(func() bool { return strings.Contains(c.Stats().LastError, "SLUICE/2 ACK") }, 5*time.Second) {
		t.Fatalf("stats %+v", c.Stats())
	}
	agent.stop()
	agent.ackPoint = "delivered"
	if err := agent.start(); err != nil {
		t.Fatal(err)
	}
	flush(t, c, 5*time.Second)
	if s := c.Stats(); s.AckPoint != "delivered" || s.Acknowledged != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestAnAgentThatClosesEveryConnectionAtOnceIsDialledWithBackoffNotInALoop(t *testing.T) {
	// As the agent does over its max_connections, or for a peer it does not allow.
	path := socketPath(t)
	listener, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	var accepted atomic.Int64
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conn.Close()
		}
	}()
	c := newClient(t, path)
	log := newLogger(c, nil)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		log.Info("into a closed door")
		time.Sleep(time.Millisecond)
	}
	// 20 ms doubling to 2 s: about seven dials in a second, not one per record written.
	if n := accepted.Load(); n > 15 {
		t.Errorf("%d connections in a second", n)
	}
}
