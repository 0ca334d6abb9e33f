package sluice

// The JSON primitives every record is built from.
//
// Owns: writing JSON strings the agent stores as they are (U+0000 and bytes that are not UTF-8
// become U+FFFD and are counted; nothing else is escaped beyond what JSON requires), the record
// time, level names, and repairing a JSON text written by someone else (sanitizeJSON).
//
// Must not: allocate on the common path (they append to the caller's buffer), or fail: every
// input has an output the agent accepts.

import (
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// replacement is U+FFFD in UTF-8: what NUL and bytes that are not UTF-8 become.
const replacement = "\ufffd"

// appendString appends s as a JSON string. A NUL or a byte that is not part of valid UTF-8
// becomes U+FFFD, each adding one to *replaced: the agent refuses both (contains_nul,
// invalid_utf8).
func appendString(dst []byte, s string, replaced *int) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case 0:
				dst = append(dst, replacement...)
				*replaced++
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, replacement...)
			*replaced++
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// encodedLen is the bytes appendString writes for the rune r of size bytes in the text.
func encodedLen(r rune, size int) int {
	switch {
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r == 0:
		return len(replacement)
	case r < 0x20:
		return 6
	case r == utf8.RuneError && size == 1:
		return len(replacement)
	}
	return size
}

// truncatedMarker ends a text cut at its end.
const truncatedMarker = "…[truncated]"

// cutString returns s cut at its end so that it takes at most budget bytes as a JSON string
// (quotes included), ending with truncatedMarker when cut; "" if not even the marker fits.
func cutString(s string, budget int) string {
	if len(s)+2 <= budget && jsonStringLen(s) <= budget {
		return s
	}
	room := budget - 2 - len(truncatedMarker)
	if room <= 0 {
		return ""
	}
	used := 0
	end := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		n := encodedLen(r, size)
		if used+n > room {
			break
		}
		used += n
		i += size
		end = i
	}
	return s[:end] + truncatedMarker
}

// elideMiddle returns s in at most budget bytes as a JSON string, keeping its beginning and its
// end and naming what was left out between them: for a stack or an error chain, both the call
// site and the root cause stay. Cuts at line ends where it can.
func elideMiddle(s string, budget int) string {
	if len(s)+2 <= budget && jsonStringLen(s) <= budget {
		return s
	}
	// The marker names a byte count of at most len(s): reserve its longest form.
	room := budget - jsonStringLen(elisionMarker(len(s)))
	if room <= 16 {
		return cutString(s, budget)
	}
	headRoom := room * 2 / 3
	head := prefixWithin(s, headRoom)
	if i := strings.LastIndexByte(head, '\n'); i > len(head)/2 {
		head = head[:i+1]
	}
	tail := suffixWithin(s[len(head):], room-jsonStringLen(head)+2)
	if i := strings.IndexByte(tail, '\n'); i >= 0 && i < len(tail)/2 {
		tail = tail[i+1:]
	}
	return head + elisionMarker(len(s)-len(head)-len(tail)) + tail
}

// elisionMarker stands for the n bytes elideMiddle left out.
func elisionMarker(n int) string {
	return "\n[… " + strconv.Itoa(n) + " bytes elided …]\n"
}

// prefixWithin is the longest prefix of s (whole runes) whose JSON text, without quotes, takes
// at most room bytes.
func prefixWithin(s string, room int) string {
	used := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		n := encodedLen(r, size)
		if used+n > room {
			return s[:i]
		}
		used += n
		i += size
	}
	return s
}

// suffixWithin is the longest suffix of s (whole runes) whose JSON text, without quotes, takes
// at most room bytes.
func suffixWithin(s string, room int) string {
	used := 0
	for i := len(s); i > 0; {
		r, size := utf8.DecodeLastRuneInString(s[:i])
		n := encodedLen(r, size)
		if used+n > room {
			return s[i:]
		}
		used += n
		i -= size
	}
	return s
}

// jsonStringLen is the bytes s takes as a JSON string, quotes included.
func jsonStringLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			n += encodedLen(rune(b), 1)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		n += encodedLen(r, size)
		i += size
	}
	return n
}

// appendTime appends t as an RFC 3339 JSON string in UTC with microseconds,
// "2026-11-30T03:04:05.123456Z", as the Python client writes it.
func appendTime(dst []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		dst = append(dst, '"')
		dst = t.AppendFormat(dst, "2006-01-02T15:04:05.000000Z07:00")
		return append(dst, '"')
	}
	hour, minute, second := t.Clock()
	micro := t.Nanosecond() / 1000
	dst = append(dst, '"')
	dst = appendDigits(dst, year, 4)
	dst = append(dst, '-')
	dst = appendDigits(dst, int(month), 2)
	dst = append(dst, '-')
	dst = appendDigits(dst, day, 2)
	dst = append(dst, 'T')
	dst = appendDigits(dst, hour, 2)
	dst = append(dst, ':')
	dst = appendDigits(dst, minute, 2)
	dst = append(dst, ':')
	dst = appendDigits(dst, second, 2)
	dst = append(dst, '.')
	dst = appendDigits(dst, micro, 6)
	return append(dst, 'Z', '"')
}

// appendDigits appends v in exactly width decimal digits (v is non-negative and fits).
func appendDigits(dst []byte, v, width int) []byte {
	var digits [8]byte
	for i := width - 1; i >= 0; i-- {
		digits[i] = byte('0' + v%10)
		v /= 10
	}
	return append(dst, digits[:width]...)
}

// levelName is the name a record's level is stored and counted under: OpenTelemetry's severity
// names, lower-cased, as every client writes them ("debug", "info", "warn", "error", "fatal" for
// slog.LevelError+4 and above); a level between them is slog's name for it, lower-cased
// ("info+2").
func levelName(level slog.Level) string {
	switch level {
	case slog.LevelDebug:
		return "debug"
	case slog.LevelInfo:
		return "info"
	case slog.LevelWarn:
		return "warn"
	case slog.LevelError:
		return "error"
	}
	if level >= slog.LevelError+4 {
		return "fatal"
	}
	return strings.ToLower(level.String())
}

// levelOf reads a level word as zap, zerolog, logrus and syslog write them; ok is false for a word
// it does not know.
func levelOf(word []byte) (level slog.Level, ok bool) {
	var lower [16]byte
	if len(word) > len(lower) {
		return slog.LevelInfo, false
	}
	for i, b := range word {
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		lower[i] = b
	}
	switch string(lower[:len(word)]) {
	case "trace", "debug":
		return slog.LevelDebug, true
	case "info", "notice", "information":
		return slog.LevelInfo, true
	case "warn", "warning":
		return slog.LevelWarn, true
	case "error", "err":
		return slog.LevelError, true
	case "fatal", "panic", "dpanic", "critical", "crit", "alert", "emergency":
		return slog.LevelError + 4, true
	}
	return slog.LevelInfo, false
}

// sanitizeJSON appends raw, a JSON text written by someone else, made storable: U+0000 (raw or
// as the escape \u0000), an escaped surrogate that is not half of a pair, and bytes that are not
// UTF-8 become U+FFFD, each adding one to *replaced. It returns the deepest nesting it saw. It
// does not check that raw is JSON (the caller does, after).
func sanitizeJSON(dst, raw []byte, replaced *int) ([]byte, int) {
	depth, deepest := 0, 0
	inString := false
	start := 0
	for i := 0; i < len(raw); {
		b := raw[i]
		if b >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, raw[start:i]...)
				dst = append(dst, replacement...)
				*replaced++
				i++
				start = i
				continue
			}
			i += size
			continue
		}
		switch {
		case b == 0:
			dst = append(dst, raw[start:i]...)
			dst = append(dst, replacement...)
			*replaced++
			i++
			start = i
			continue
		case !inString:
			switch b {
			case '"':
				inString = true
			case '{', '[':
				depth++
				deepest = max(deepest, depth)
			case '}', ']':
				depth--
			}
		case b == '"':
			inString = false
		case b == '\\' && i+1 < len(raw):
			if raw[i+1] != 'u' {
				i += 2
				continue
			}
			unit, ok := hex4(raw, i+2)
			if !ok {
				i += 2
				continue
			}
			bad := unit == 0 || (unit >= 0xDC00 && unit <= 0xDFFF)
			if unit >= 0xD800 && unit <= 0xDBFF {
				next, ok := uint16(0), false
				if i+7 < len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
					next, ok = hex4(raw, i+8)
				}
				if ok && next >= 0xDC00 && next <= 0xDFFF {
					i += 12 // the pair
					continue
				}
				bad = true
			}
			if bad {
				dst = append(dst, raw[start:i]...)
				dst = append(dst, `\ufffd`...)
				*replaced++
				i += 6
				start = i
				continue
			}
			i += 6
			continue
		}
		i++
	}
	return append(dst, raw[start:]...), deepest
}

// hex4 reads the four hex digits at raw[i:i+4].
func hex4(raw []byte, i int) (uint16, bool) {
	if i+4 > len(raw) {
		return 0, false
	}
	var v uint16
	for _, c := range raw[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			v = v<<4 | uint16(c-'0')
		case 'a' <= c && c <= 'f':
			v = v<<4 | uint16(c-'a'+10)
		case 'A' <= c && c <= 'F':
			v = v<<4 | uint16(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}
