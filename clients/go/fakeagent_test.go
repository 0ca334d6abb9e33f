package sluice

// A small in-process stand-in for the agent's lines listener (docs/PROTOCOL.md).
//
// It accepts connections on a Unix socket, collects the records, checks each as the agent does
// (size, UTF-8, NUL and its JSON escape, lone surrogate escapes, depth) and, for a connection that
// opens with SLUICE/1 ACK or a client session's SLUICE/2 ACK session=… first=… (each line then
// "<unix µs> <record>"), answers "OK spooled" then "NAK n reason" / "ACK n" with the session's own
// numbers, keeping each session line as (session, n, time, record). It can be stopped and started
// again on the same path, told to stop reading (stall) or to hold its ACKs.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

const fakeMaxRecordSize = 1 << 20

var (
	sessionHandshake = regexp.MustCompile(`^SLUICE/2 ACK session=([0-9a-f]{32}) first=([1-9][0-9]*)$`)
	stampedLine      = regexp.MustCompile(`(?s)^([0-9]{1,19}) (.*)$`)
	escapeUnit       = regexp.MustCompile(`\\(u[0-9a-fA-F]{4}|.)`)
)

// agentCheck is the agent's reason to refuse line (without its newline), or "".
func agentCheck(line []byte, maxRecordSize int) string {
	switch {
	case len(line) > maxRecordSize:
		return "too_large"
	case len(line) == 0:
		return "empty"
	case !utf8.Valid(line):
		return "invalid_utf8"
	case bytes.IndexByte(line, 0) >= 0:
		return "contains_nul"
	case line[0] != '{':
		return ""
	}
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, b := range line {
		switch {
		case inString && escaped:
			escaped = false
		case inString && b == '\\':
			escaped = true
		case inString && b == '"':
			inString = false
		case inString:
		case b == '"':
			inString = true
		case b == '{' || b == '[':
			depth++
			deepest = max(deepest, depth)
		case b == '}' || b == ']':
			depth--
		}
	}
	if deepest > 64 {
		return "too_deep"
	}
	units := escapeUnit.FindAllSubmatch(line, -1)
	for i := 0; i < len(units); i++ {
		unit := units[i][1]
		if unit[0] != 'u' {
			continue
		}
		value, _ := strconv.ParseUint(string(unit[1:]), 16, 16)
		switch {
		case value == 0:
			return "contains_nul"
		case value >= 0xD800 && value <= 0xDBFF:
			if i+1 >= len(units) || units[i+1][1][0] != 'u' {
				return "unpaired_surrogate"
			}
			next, _ := strconv.ParseUint(string(units[i+1][1][1:]), 16, 16)
			if next < 0xDC00 || next > 0xDFFF {
				return "unpaired_surrogate"
			}
			i++
		case value >= 0xDC00 && value <= 0xDFFF:
			return "unpaired_surrogate"
		}
	}
	return ""
}

type rejection struct {
	reason string
	line   []byte
}

type sessionStart struct {
	session string
	first   uint64
}

type numberedLine struct {
	session string
	n       uint64
	timeUs  int64
	record  string
}

// fakeAgent: see the file comment. Fields under mu are read by tests through waitFor, snapshot
// accessors, or with mu held.
type fakeAgent struct {
	path          string
	ackPoint      string
	nak           func(n uint64, line []byte) string // extra refusals
	maxRecordSize int
	// discard: count lines (in taken) without keeping or checking them — for benchmarks, which
	// would otherwise hold every line and spend the CPU they measure on checking them.
	discard bool
	taken   atomic.Int64

	mu             sync.Mutex
	lines          [][]byte // every record taken in, in order of arrival
	rejected       []rejection
	connections    int
	ackConnections int
	sessions       []sessionStart
	numbered       []numberedLine

	holdAcks atomic.Bool
	stalled  atomic.Bool
	running  atomic.Bool

	listener *net.UnixListener
	conns    map[net.Conn]bool
	wg       sync.WaitGroup
}

// newFakeAgent makes an agent on path, not started; it is stopped when the test ends.
func newFakeAgent(t testing.TB, path string) *fakeAgent {
	a := &fakeAgent{path: path, ackPoint: "spooled", maxRecordSize: fakeMaxRecordSize, conns: map[net.Conn]bool{}}
	t.Cleanup(a.stop)
	return a
}

// startFakeAgent makes an agent on path and starts it.
func startFakeAgent(t testing.TB, path string) *fakeAgent {
	a := newFakeAgent(t, path)
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *fakeAgent) start() error {
	listener, err := net.ListenUnix("unix", &net.UnixAddr{Name: a.path, Net: "unix"})
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.listener = listener
	a.mu.Unlock()
	a.running.Store(true)
	a.wg.Add(1)
	go a.accept(listener)
	return nil
}

// stop closes the listener and every connection, waits for them, and removes the socket file.
func (a *fakeAgent) stop() {
	a.running.Store(false)
	a.stalled.Store(false)
	a.mu.Lock()
	if a.listener != nil {
		a.listener.Close()
		a.listener = nil
	}
	for conn := range a.conns {
		conn.Close()
	}
	a.mu.Unlock()
	a.wg.Wait()
	a.mu.Lock()
	clear(a.conns)
	a.mu.Unlock()
	os.Remove(a.path)
}

func (a *fakeAgent) restart(t testing.TB) {
	a.stop()
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
}

func (a *fakeAgent) accept(listener *net.UnixListener) {
	defer a.wg.Done()
	for {
		conn, err := listener.Accept()
		if err != nil {
			return
		}
		a.mu.Lock()
		if !a.running.Load() {
			a.mu.Unlock()
			conn.Close()
			return
		}
		a.connections++
		a.conns[conn] = true
		a.wg.Add(1)
		a.mu.Unlock()
		go a.serve(conn)
	}
}

func (a *fakeAgent) serve(conn net.Conn) {
	defer a.wg.Done()
	defer conn.Close()
	var (
		buffered     []byte
		first        = true
		acknowledged bool
		session      string
		number       uint64
		replies      []byte
		pendingAck   uint64
		chunk        = make([]byte, 64<<10)
	)
	for a.running.Load() {
		if a.stalled.Load() {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if acknowledged && !a.holdAcks.Load() && pendingAck > 0 {
			replies = fmt.Appendf(replies, "ACK %d\n", pendingAck)
			pendingAck = 0
		}
		if len(replies) > 0 {
			conn.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := conn.Write(replies); err != nil {
				return
			}
			replies = replies[:0]
		}
		conn.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, err := conn.Read(chunk)
		buffered = append(buffered, chunk[:n]...)
		for {
			i := bytes.IndexByte(buffered, '\n')
			if i < 0 {
				break
			}
			line := bytes.TrimSuffix(buffered[:i], []byte{'\r'})
			buffered = buffered[i+1:]
			if a.discard {
				a.taken.Add(1)
				continue
			}
			line = append([]byte(nil), line...)
			if first {
				first = false
				if m := sessionHandshake.FindSubmatch(line); m != nil || string(line) == "SLUICE/1 ACK" {
					acknowledged = true
					a.mu.Lock()
					a.ackConnections++
					if m != nil {
						session = string(m[1])
						firstNumber, _ := strconv.ParseUint(string(m[2]), 10, 64)
						number = firstNumber - 1
						a.sessions = append(a.sessions, sessionStart{session, firstNumber})
					}
					a.mu.Unlock()
					replies = fmt.Appendf(replies, "OK %s\n", a.ackPoint)
					continue
				}
			}
			number++
			if session != "" {
				m := stampedLine.FindSubmatch(line)
				if m == nil {
					a.mu.Lock()
					a.rejected = append(a.rejected, rejection{"malformed", line})
					a.mu.Unlock()
					replies = fmt.Appendf(replies, "NAK %d malformed\n", number)
					pendingAck = number
					continue
				}
				timeUs, _ := strconv.ParseInt(string(m[1]), 10, 64)
				line = m[2]
				a.mu.Lock()
				a.numbered = append(a.numbered, numberedLine{session, number, timeUs, string(line)})
				a.mu.Unlock()
			}
			reason := agentCheck(line, a.maxRecordSize)
			if reason == "" && a.nak != nil {
				reason = a.nak(number, line)
			}
			a.mu.Lock()
			if reason == "" {
				a.lines = append(a.lines, line)
			} else {
				a.rejected = append(a.rejected, rejection{reason, line})
			}
			a.mu.Unlock()
			if acknowledged {
				if reason != "" {
					replies = fmt.Appendf(replies, "NAK %d %s\n", number, reason)
				}
				pendingAck = number
			}
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return
		}
	}
}

func (a *fakeAgent) stall()  { a.stalled.Store(true) }
func (a *fakeAgent) resume() { a.stalled.Store(false) }

// waitFor polls cond (called with mu held) until it holds or timeout passes.
func (a *fakeAgent) waitFor(cond func(a *fakeAgent) bool, timeout time.Duration) bool {
	return waitUntil(func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return cond(a)
	}, timeout)
}

func (a *fakeAgent) waitForLines(n int) bool {
	return a.waitFor(func(a *fakeAgent) bool { return len(a.lines) >= n }, 5*time.Second)
}

// records are the records taken in, decoded.
func (a *fakeAgent) records(t testing.TB) []map[string]any {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	records := make([]map[string]any, len(a.lines))
	for i, line := range a.lines {
		if err := json.Unmarshal(line, &records[i]); err != nil {
			t.Fatalf("record %d is not JSON: %v: %q", i, err, line)
		}
	}
	return records
}

// messages are the "message" fields of the records, without in-band reports.
func (a *fakeAgent) messages(t testing.TB) []string {
	var messages []string
	for _, r := range a.records(t) {
		if _, report := r["sluice.client"]; !report {
			message, _ := r["message"].(string)
			messages = append(messages, message)
		}
	}
	return messages
}

// expect waits for n records and returns them, failing if the agent would refuse any line (a
// plain-mode flush only means written, not read).
func (a *fakeAgent) expect(t testing.TB, n int) []map[string]any {
	t.Helper()
	if !a.waitForLines(n) {
		a.mu.Lock()
		got := len(a.lines)
		a.mu.Unlock()
		t.Fatalf("%d of %d records arrived", got, n)
	}
	a.mu.Lock()
	rejected := a.rejected
	a.mu.Unlock()
	if len(rejected) > 0 {
		t.Fatalf("the agent would refuse %d line(s), first %s: %.200q", len(rejected), rejected[0].reason, rejected[0].line)
	}
	return a.records(t)
}

func (a *fakeAgent) snapshot() (connections int, sessions []sessionStart, numbered []numberedLine, rejected []rejection) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.connections, append([]sessionStart(nil), a.sessions...),
		append([]numberedLine(nil), a.numbered...), append([]rejection(nil), a.rejected...)
}

// line is the i-th record taken in.
func (a *fakeAgent) line(i int) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lines[i]
}
