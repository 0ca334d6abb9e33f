package sluice

// The io.Writer for loggers that write lines: zap, zerolog, logrus, the log package.
//
// Owns: splitting what is written into records (one a line), passing a JSON object line through
// as it is — repaired if the agent would refuse it, cut if too long — and wrapping any other line
// as {"time", "message"}; reading the record's level for the drop policy.
//
// Must not: wait, or return an error: Write returns len(p), nil even when records are dropped,
// because a logger that sees an error from its writer may retry, block or write to stderr itself.
// Drops are counted in Client.Stats like every other.

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"time"
)

// Writer returns an io.Writer whose every line is one record; a write that does not end with a
// newline is a record too (loggers write one record per Write). A line that is a JSON object is
// sent as it is (zap's and zerolog's JSON output); any other line becomes
// {"time": …, "message": line}. Write never blocks and always returns len(p), nil — a record that
// does not fit in the queue is dropped and counted (Client.Stats), not returned as an error.
func (c *Client) Writer() io.Writer { return lineWriter{c} }

type lineWriter struct{ c *Client }

func (w lineWriter) Write(p []byte) (int, error) {
	rest := p
	for len(rest) > 0 {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		w.c.writeLine(line)
	}
	return len(p), nil
}

// writeLine enqueues one line as a record; a blank line is no record (the agent refuses it).
func (c *Client) writeLine(line []byte) {
	line = bytes.TrimSuffix(line, []byte{'\r'})
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) == 0 {
		return
	}
	now := time.Now()
	e := getEncoder()
	defer putEncoder(e)
	level := slog.LevelInfo
	isJSON := false
	if trimmed[0] == '{' && trimmed[len(trimmed)-1] == '}' {
		var depth int
		e.buf, depth = sanitizeJSON(e.buf, trimmed, &e.rep)
		if isJSON = depth <= maxJSONDepth && json.Valid(e.buf); isJSON {
			level = levelField(e.buf)
		}
	}
	if !isJSON {
		e.buf, e.rep = append(e.buf[:0], `{"time":`...), 0
		e.buf = appendTime(e.buf, now)
		e.buf = append(e.buf, `,"message":`...)
		e.buf = appendString(e.buf, string(line), &e.rep)
		e.buf = append(e.buf, '}')
	}
	record, truncated := e.buf, false
	if len(record) > c.cfg.maxRecordSize {
		record, truncated = fitRecord(record, c.cfg.maxRecordSize), true
	}
	c.enqueue(record, level, e.rep > 0, truncated, now)
}

// levelField reads the record's "level" (a word, or a bunyan/pino number) for the drop policy;
// slog.LevelInfo if it has none this package knows. It looks for the first "level" key, which in
// the JSON loggers write is the top-level one.
func levelField(record []byte) slog.Level {
	i := bytes.Index(record, []byte(`"level"`))
	if i < 0 {
		return slog.LevelInfo
	}
	rest := bytes.TrimLeft(record[i+len(`"level"`):], " \t")
	if len(rest) == 0 || rest[0] != ':' {
		return slog.LevelInfo
	}
	rest = bytes.TrimLeft(rest[1:], " \t")
	if len(rest) > 0 && rest[0] == '"' {
		if end := bytes.IndexByte(rest[1:], '"'); end >= 0 {
			level, _ := levelOf(rest[1 : 1+end])
			return level
		}
		return slog.LevelInfo
	}
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	switch string(rest[:end]) {
	case "10", "20":
		return slog.LevelDebug
	case "40":
		return slog.LevelWarn
	case "50":
		return slog.LevelError
	case "60":
		return slog.LevelError + 4
	}
	return slog.LevelInfo
}
