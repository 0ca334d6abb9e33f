package sluice

// Records the agent would refuse are repaired or cut on the client, never refused whole.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// chainOf is an error wrapping depth others, the root cause at the bottom.
func chainOf(depth int) error {
	err := errors.New("root cause at the bottom")
	for i := 0; i < depth; i++ {
		err = fmt.Errorf("layer %d of the call that failed: %w", i, err)
	}
	return err
}

func TestAnOversizeRecordIsCutWithTruncatedTrueKeepingTheMessagesStartAndTheRootCause(t *testing.T) {
	const limit = 4096
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	agent.maxRecordSize = limit
	c := newClient(t, path, WithMaxRecordSize(limit))
	newLogger(c, nil).Error(strings.Repeat("x", 10_000), "err", chainOf(40))
	flush(t, c, 5*time.Second)

	record := agent.expect(t, 1)[0]
	if n := len(agent.line(0)); n > limit {
		t.Fatalf("%d bytes, limit %d", n, limit)
	}
	message := record["message"].(string)
	if record["truncated"] != true || !strings.HasPrefix(message, "xxxx") || !strings.HasSuffix(message, truncatedMarker) {
		t.Errorf("truncated %v, message %.20q…", record["truncated"], message)
	}
	chain := record["err"].(string) // the error object, shortened to its text with the middle left out
	if !strings.HasPrefix(chain, `{"message":"layer 39`) || !strings.Contains(chain, "root cause at the bottom") ||
		!strings.Contains(chain, "bytes elided") {
		t.Errorf("err %q", chain)
	}
	if s := c.Stats(); s.Truncated != 1 || s.Replaced != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestHugeAttrsAreCutThenLeftOutBeforeTheMessage(t *testing.T) {
	const limit = 2048
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path, WithMaxRecordSize(limit))
	log := newLogger(c, nil)
	log.Warn("the message matters", "blob", strings.Repeat("b", 50_000), "small", 1)
	log.Warn("so does this one", "a", strings.Repeat("a", 900), "b", strings.Repeat("b", 900),
		"c", strings.Repeat("c", 900), "d", strings.Repeat("d", 900), "e", strings.Repeat("e", 900))
	flush(t, c, 5*time.Second)

	records := agent.expect(t, 2)
	for i := range records {
		if len(agent.line(i)) > limit {
			t.Fatalf("record %d: %d bytes", i, len(agent.line(i)))
		}
	}
	first, second := records[0], records[1]
	if first["message"] != "the message matters" || first["small"] != float64(1) || first["truncated"] != true {
		t.Errorf("record %v", first)
	}
	if blob, _ := first["blob"].(string); !strings.HasPrefix(blob, "bbb") || len(blob) > limit/16 {
		t.Errorf("blob %q", blob)
	}
	if second["message"] != "so does this one" || second["elided_fields"] == nil {
		t.Errorf("fields left out are named: %v", second)
	}
}

func TestRecordsWithinTheLimitAreNotTouched(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path, WithMaxRecordSize(1024))
	newLogger(c, nil).Info("fine", "a", strings.Repeat("a", 500))
	flush(t, c, 5*time.Second)
	agent.expect(t, 1)
	if strings.Contains(string(agent.line(0)), "truncated") || c.Stats().Truncated != 0 {
		t.Errorf("touched: %s", agent.line(0))
	}
}

func TestEveryCutRecordFitsAndIsStorableWhateverItsShape(t *testing.T) {
	const limit = 512
	many := make([]any, 0, 100)
	for i := 0; i < 50; i++ {
		many = append(many, fmt.Sprintf("k%d", i), strings.Repeat("v", 100))
	}
	shapes := map[string][]any{
		"backslashes double":    {strings.Repeat(`\`, 5000)},
		"control characters":    {strings.Repeat("\x01", 5000)},
		"multibyte":             {strings.Repeat("é😀", 2000)},
		"an error chain":        {"m", "err", chainOf(30)},
		"many attributes":       append([]any{"m"}, many...),
		"a huge key":            {"m", strings.Repeat("k", 3000), 1},
		"a huge nested group":   {"m", slog.Group("g", "a", strings.Repeat("a", 3000))},
		"NUL and invalid UTF-8": {strings.Repeat("\x00\xff", 3000)},
	}
	for name, shape := range shapes {
		c, err := New(socketPath(t), WithMaxRecordSize(limit), WithNoticeOutput(nil))
		if err != nil {
			t.Fatal(err)
		}
		handler := c.Handler(&HandlerOptions{Logger: "cut"})
		record := slog.NewRecord(time.Now(), slog.LevelError, shape[0].(string), 0)
		record.Add(shape[1:]...)
		if err := handler.Handle(context.Background(), record); err != nil {
			t.Fatal(err)
		}
		c.q.mu.Lock()
		line := c.q.at(0).data
		c.q.mu.Unlock()
		line = line[:len(line)-1]
		c.Close(timeout(time.Millisecond))
		var doc map[string]any
		switch {
		case len(line) > limit:
			t.Errorf("%s: %d bytes", name, len(line))
		case agentCheck(line, limit) != "":
			t.Errorf("%s: the agent would refuse it: %s", name, agentCheck(line, limit))
		case json.Unmarshal(line, &doc) != nil || doc["truncated"] != true:
			t.Errorf("%s: %s", name, line)
		}
	}
}

func TestNULInvalidUTF8AndTheirJSONEscapesAreReplacedAndCounted(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	log := newLogger(c, nil)
	log.Info("raw \x00 nul")
	log.Info("bytes", "payload", []byte("\xff\xfeok"), "\x00key", "v")
	log.Info(`a literal backslash-u0000 is text: \u0000`)
	log.Info("clean")
	w := c.Writer()
	fmt.Fprintln(w, `{"msg":"escaped \u0000 nul and a lone \ud800 surrogate, a pair \ud83d\ude00"}`)
	fmt.Fprintln(w, "{\"msg\":\"raw \xff byte\"}")
	flush(t, c, 5*time.Second)

	records := agent.expect(t, 6)
	want := []string{"raw \ufffd nul", "bytes", `a literal backslash-u0000 is text: \u0000`, "clean"}
	for i, message := range want {
		if records[i]["message"] != message {
			t.Errorf("record %d: %q, want %q", i, records[i]["message"], message)
		}
	}
	if records[1]["payload"] != "\ufffd\ufffdok" || records[1]["\ufffdkey"] != "v" {
		t.Errorf("record 1: %v", records[1])
	}
	if got := records[4]["msg"]; got != "escaped \ufffd nul and a lone \ufffd surrogate, a pair 😀" {
		t.Errorf("record 4: %q", got)
	}
	if got := records[5]["msg"]; got != "raw \ufffd byte" {
		t.Errorf("record 5: %q", got)
	}
	if s := c.Stats(); s.Replaced != 4 {
		t.Errorf("replaced %d, want 4 records", s.Replaced)
	}
}

func TestCutStringEndsWithTheMarkerWithinItsBudget(t *testing.T) {
	for _, s := range []string{strings.Repeat("a", 100), strings.Repeat("é", 100), strings.Repeat("\n", 100), strings.Repeat("\x01", 100)} {
		for budget := 0; budget < 120; budget++ {
			cut := cutString(s, budget)
			if n := jsonStringLen(cut); cut != "" && n > budget {
				t.Fatalf("%q in %d: %d bytes", s[:4], budget, n)
			}
			if cut != s && cut != "" && !strings.HasSuffix(cut, truncatedMarker) {
				t.Fatalf("%q in %d: %q", s[:4], budget, cut)
			}
		}
	}
}

func TestElideMiddleKeepsBothEndsWithinItsBudget(t *testing.T) {
	lines := make([]string, 200)
	for i := range lines {
		lines[i] = fmt.Sprintf("frame %d", i)
	}
	text := strings.Join(lines, "\n")
	cut := elideMiddle(text, 400)
	if jsonStringLen(cut) > 400 {
		t.Fatalf("%d bytes", jsonStringLen(cut))
	}
	if !strings.HasPrefix(cut, "frame 0\nframe 1\n") || !strings.HasSuffix(cut, "frame 198\nframe 199") || !strings.Contains(cut, "bytes elided") {
		t.Errorf("%q", cut)
	}
	if elideMiddle("short", 400) != "short" {
		t.Error("a text that fits is kept")
	}
}

func TestSanitizeJSONReplacesOnlyWhatTheAgentRefuses(t *testing.T) {
	cases := map[string]string{
		`{"a":"\u0000"}`:               `{"a":"\ufffd"}`,
		`{"a":"\\u0000"}`:              `{"a":"\\u0000"}`, // an escaped backslash, then text
		`{"a":"\ud800x"}`:              `{"a":"\ufffdx"}`,
		`{"a":"\udc00"}`:               `{"a":"\ufffd"}`,
		`{"a":"\ud83d\ude00"}`:         `{"a":"\ud83d\ude00"}`,
		"{\"a\":\"\x00\"}":             "{\"a\":\"\ufffd\"}",
		"{\"a\":\"\xc3\x28\"}":         "{\"a\":\"\ufffd(\"}",
		`{"a":[[[1]]],"b":"\"[[["}`:    `{"a":[[[1]]],"b":"\"[[["}`,
		`{"a":"\u00e9 \"\\\" \u0041"}`: `{"a":"\u00e9 \"\\\" \u0041"}`,
	}
	for in, want := range cases {
		var replaced int
		got, depth := sanitizeJSON(nil, []byte(in), &replaced)
		if string(got) != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
		if (replaced > 0) != (in != want) {
			t.Errorf("%q: %d replaced", in, replaced)
		}
		if strings.Contains(in, "[[[1]]]") && depth != 4 {
			t.Errorf("%q: depth %d", in, depth)
		}
	}
}
