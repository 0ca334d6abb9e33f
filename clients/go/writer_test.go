package sluice

// The io.Writer: one record per line, JSON object lines as they are, other lines wrapped.

import (
	"fmt"
	"log"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestEachWriteIsOneRecordAndJSONObjectLinesPassThroughAsTheyAre(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	w := c.Writer()
	zapLine := `{"level":"info","ts":1767225600.123456,"caller":"shop/pay.go:42","msg":"paid","order":17}`
	zerologLine := `{"level":"warn","order":{"id":17},"time":"2026-01-01T00:00:00Z","message":"slow"}`
	fmt.Fprintln(w, zapLine)
	fmt.Fprint(w, zerologLine) // no newline: a record too
	flush(t, c, 5*time.Second)

	agent.expect(t, 2)
	if got := string(agent.line(0)); got != zapLine {
		t.Errorf("zap's line changed: %s", got)
	}
	if got := string(agent.line(1)); got != zerologLine {
		t.Errorf("zerolog's line changed: %s", got)
	}
}

func TestAWriteOfSeveralLinesIsOneRecordEachAndBlankLinesAreNone(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	n, err := c.Writer().Write([]byte("{\"msg\":\"one\"}\n\n  \r\n{\"msg\":\"two\"}\r\nthree\n"))
	if n != 40 || err != nil {
		t.Errorf("write: %d, %v", n, err)
	}
	flush(t, c, 5*time.Second)
	records := agent.expect(t, 3)
	if records[0]["msg"] != "one" || records[1]["msg"] != "two" || records[2]["message"] != "three" {
		t.Errorf("records %v", records)
	}
	if s := c.Stats(); s.Sent != 3 {
		t.Errorf("stats %+v", s)
	}
}

func TestOtherLinesAreWrappedAsAMessageWithTheTime(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	std := log.New(c.Writer(), "shop ", log.LstdFlags)
	std.Printf("paid order %d", 17)
	deep := strings.Repeat("[", 70) + strings.Repeat("]", 70)
	w := c.Writer()
	fmt.Fprintln(w, `{"not":"json"`+"}}")
	fmt.Fprintln(w, `{"deep":`+deep+`}`)
	flush(t, c, 5*time.Second)

	records := agent.expect(t, 3)
	if !regexp.MustCompile(`^shop \d{4}/\d\d/\d\d \d\d:\d\d:\d\d paid order 17$`).MatchString(records[0]["message"].(string)) {
		t.Errorf("record %v", records[0])
	}
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`).MatchString(records[0]["time"].(string)) {
		t.Errorf("time %v", records[0]["time"])
	}
	if records[1]["message"] != `{"not":"json"}}` {
		t.Errorf("a line that is not JSON is text: %v", records[1])
	}
	if records[2]["message"] != `{"deep":`+deep+`}` {
		t.Errorf("JSON nested deeper than the agent takes is text: %v", records[2])
	}
}

func TestAnOversizeJSONLineIsCutKeepingItsMessagesStartAndItsStacksEnds(t *testing.T) {
	const limit = 4096
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path, WithMaxRecordSize(limit))
	var frames []string
	for i := 0; i < 300; i++ {
		frames = append(frames, fmt.Sprintf("main.f%d\\n\\t/src/main.go:%d", i, i))
	}
	line := `{"level":"error","ts":1.5,"msg":"` + strings.Repeat("m", 10_000) + `","stacktrace":"` + strings.Join(frames, `\n`) + `"}`
	fmt.Fprintln(c.Writer(), line)
	flush(t, c, 5*time.Second)

	record := agent.expect(t, 1)[0]
	if len(agent.line(0)) > limit || record["truncated"] != true || record["level"] != "error" || record["ts"] != 1.5 {
		t.Errorf("%d bytes: %.300s", len(agent.line(0)), agent.line(0))
	}
	stack := record["stacktrace"].(string)
	if !strings.HasPrefix(stack, "main.f0\n") || !strings.HasSuffix(stack, "main.f299\n\t/src/main.go:299") {
		t.Errorf("stack %.100q … %q", stack, stack[max(0, len(stack)-100):])
	}
	if msg := record["msg"].(string); !strings.HasPrefix(msg, "mmm") || !strings.HasSuffix(msg, truncatedMarker) {
		t.Errorf("msg %.50q", msg)
	}
}

func TestWriteReturnsLenAndNilAfterCloseToo(t *testing.T) {
	c := newClient(t, socketPath(t))
	c.Close(timeout(10 * time.Millisecond))
	n, err := c.Writer().Write([]byte("dropped\n"))
	if n != 8 || err != nil {
		t.Errorf("write: %d, %v", n, err)
	}
	if s := c.Stats(); s.Dropped[DropClosed]["info"] != 1 {
		t.Errorf("stats %+v", s)
	}
}
