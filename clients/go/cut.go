package sluice

// Cutting a record longer than the listener's max_record_size, so that the agent stores most of
// it instead of refusing all of it (too_large).
//
// Owns: the order in which a record gives up room — large extra fields are shortened first, then
// left out (named in "elided_fields"), then the message and any stack trace share what is left
// (a message keeps its beginning; a stack or an error chain its beginning and its end, the root
// cause) — and "truncated": true. The same rules as the Python client's.
//
// Must not: run unless a record is too long (it parses the record: the slow path), or return a
// record longer than the limit.

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"
)

// elidedFieldsMax bounds the list of the fields left out.
const elidedFieldsMax = 1024

// field is one top-level field of a record: its key and its value as JSON.
type field struct {
	key string
	raw []byte
}

func (f field) size() int { return jsonStringLen(f.key) + 1 + len(f.raw) + 1 }

// keptFields are never shortened: small, and what a record is found by.
var keptFields = map[string]bool{
	"time": true, "ts": true, "timestamp": true, "@timestamp": true, "level": true, "logger": true,
	"process": true, "trace_id": true, "span_id": true, "caller": true, "source": true,
}

// messageFields share the room left once the rest fits: kept from their beginning.
var messageFields = map[string]bool{"message": true, "msg": true}

// stackFields share it too, kept at both ends (the call site and the root cause).
var stackFields = map[string]bool{"stack": true, "stack_trace": true, "stacktrace": true}

// fitRecord returns record (a JSON object) cut to at most limit bytes.
func fitRecord(record []byte, limit int) []byte {
	fields, ok := parseObject(record)
	if !ok {
		return minimalRecord(nil, string(record), limit)
	}
	var texts, extras []int // indexes into fields
	kept := fields[:0]
	for _, f := range fields {
		if f.key != "truncated" && f.key != "elided_fields" {
			kept = append(kept, f)
		}
	}
	fields = kept
	for i, f := range fields {
		switch {
		case keptFields[f.key]:
		case (messageFields[f.key] || stackFields[f.key]) && len(f.raw) > 0 && f.raw[0] == '"':
			texts = append(texts, i)
		default:
			extras = append(extras, i)
		}
	}

	// Extra fields take at most a quarter of the record: the largest are shortened, then left out.
	var elided []string
	extraSize := 0
	for _, i := range extras {
		extraSize += fields[i].size()
	}
	if share := limit / 4; extraSize > share {
		capSize := max(limit/16, 64)
		for _, i := range extras {
			f := &fields[i]
			if f.size() <= capSize {
				continue
			}
			budget := capSize - jsonStringLen(f.key) - 2
			before := f.size()
			if s, ok := stringValue(f.raw); ok {
				f.raw = appendString(nil, cutString(s, budget), new(int))
			} else {
				f.raw = appendString(nil, elideMiddle(string(f.raw), budget), new(int))
			}
			extraSize += f.size() - before
		}
		sort.SliceStable(extras, func(a, b int) bool { return fields[extras[a]].size() > fields[extras[b]].size() })
		for _, i := range extras {
			if extraSize <= share {
				break
			}
			extraSize -= fields[i].size()
			elided = append(elided, fields[i].key)
			fields[i].raw = nil
		}
	}
	var tail []field
	if len(elided) > 0 {
		tail = append(tail, field{"elided_fields", appendString(nil, cutString(strings.Join(elided, ","), elidedFieldsMax), new(int))})
	}
	tail = append(tail, field{"truncated", []byte("true")})

	// The message and the stack trace share what is left.
	originals := make([]string, len(texts))
	needs := make([]int, len(texts))
	for j, i := range texts {
		originals[j], _ = stringValue(fields[i].raw)
		needs[j] = jsonStringLen(originals[j]) - 2
		fields[i].raw = []byte(`""`)
	}
	margin := 0
	for attempt := 0; attempt < 4; attempt++ {
		available := limit - len(encodeFields(nil, fields, tail)) - margin
		budgets := share(needs, available)
		for j, i := range texts {
			var text string
			if stackFields[fields[i].key] {
				text = elideMiddle(originals[j], budgets[j]+2)
			} else {
				text = cutString(originals[j], budgets[j]+2)
			}
			fields[i].raw = appendString(nil, text, new(int))
		}
		out := encodeFields(nil, fields, tail)
		if len(out) <= limit {
			return out
		}
		margin += len(out) - limit + 64
	}
	// Last resort (a logger name of a megabyte?): the bare minimum, cut to fit.
	message := ""
	if len(originals) > 0 {
		message = originals[0]
	}
	return minimalRecord(fields, message, limit)
}

// minimalRecord is {"time", "level", "logger", "message", "truncated": true} from what fields
// hold, cut to limit.
func minimalRecord(fields []field, message string, limit int) []byte {
	out := []byte{'{'}
	for _, f := range fields {
		if (f.key == "time" || f.key == "level") && len(f.raw) <= 64 {
			out = appendString(out, f.key, new(int))
			out = append(out, ':')
			out = append(out, f.raw...)
			out = append(out, ',')
		}
		if s, ok := stringValue(f.raw); ok && f.key == "logger" {
			out = append(out, `"logger":`...)
			out = appendString(out, cutString(s, 128), new(int))
			out = append(out, ',')
		}
	}
	out = append(out, `"message":`...)
	const end = `,"truncated":true}`
	out = appendString(out, cutString(message, limit-len(out)-len(end)), new(int))
	return append(out, end...)
}

// encodeFields appends the object of fields (those with a value) and then tail.
func encodeFields(dst []byte, fields, tail []field) []byte {
	dst = append(dst, '{')
	for _, list := range [][]field{fields, tail} {
		for _, f := range list {
			if f.raw == nil {
				continue
			}
			if len(dst) > 1 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, f.key, new(int))
			dst = append(dst, ':')
			dst = append(dst, f.raw...)
		}
	}
	return append(dst, '}')
}

// parseObject splits a JSON object into its top-level fields, in order.
func parseObject(record []byte) ([]field, bool) {
	dec := json.NewDecoder(bytes.NewReader(record))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var fields []field
	for dec.More() {
		tok, err := dec.Token()
		key, ok := tok.(string)
		if err != nil || !ok {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		fields = append(fields, field{key, raw})
	}
	return fields, true
}

// stringValue is the text of a JSON string value.
func stringValue(raw []byte) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// share splits total between needs: the small in full, the large equally.
func share(needs []int, total int) []int {
	alloc := make([]int, len(needs))
	remaining := max(total, 0)
	order := make([]int, len(needs))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return needs[order[a]] < needs[order[b]] })
	for position, i := range order {
		alloc[i] = min(needs[i], remaining/(len(order)-position))
		remaining -= alloc[i]
	}
	return alloc
}
