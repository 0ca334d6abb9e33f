package sluice

// The slog.Handler applications configure.
//
// Owns: turning a slog.Record into one JSON line with the Python client's field names — time,
// level, logger, message, process, then the attributes (groups nested, WithAttrs encoded once
// when the handler is made), errors with their whole chain, trace_id and span_id at the top — and
// offering it to the queue.
//
// Must not: wait (Handle encodes into a pooled buffer and makes one non-blocking enqueue), return
// an error for a record (a record that cannot be encoded is counted format_error, a value whose
// method panics is rendered "!PANIC: …"), or write a line the agent refuses: every string is
// repaired (encode.go), nesting stays below the agent's max_json_depth, and a record longer than
// max_record_size is cut (cut.go).

import (
	"context"
	"encoding"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"time"
)

const (
	// maxGroupDepth is the deepest nesting of groups kept; WithGroup beyond it adds no level, and
	// a deeper group attribute becomes its text.
	maxGroupDepth = 16
	// maxJSONDepth is the agent's ingest.max_json_depth: a record nested deeper is refused
	// (too_deep), so a value that would take the record past it is written as its JSON text.
	maxJSONDepth = 64
	// maxChain is the most wrapped errors listed under "chain".
	maxChain = 32
	// maxPooledBuffer: an encoder whose buffer grew beyond this (a huge record) is not kept.
	maxPooledBuffer = 64 << 10
)

// HandlerOptions configure a Handler. The zero value (or nil) logs at slog.LevelInfo and above.
type HandlerOptions struct {
	// Level is the lowest level handled (default slog.LevelInfo).
	Level slog.Leveler
	// Logger is the "logger" field of every record (omitted if empty): the component's name.
	Logger string
	// Fields are added to every record (service, version, …), in key order.
	Fields map[string]any
	// AddSource adds "source": {"function", "file", "line"} from the record's caller.
	AddSource bool
	// ContextAttrs, if set, is called with each Handle's context; the attributes it returns are
	// added at the top level of the record. This is where trace ids come from without this
	// package depending on OpenTelemetry: return slog.String("trace_id", …) and
	// slog.String("span_id", …) from the active span (README.md shows it).
	ContextAttrs func(ctx context.Context) []slog.Attr
}

// Handler is a slog.Handler that ships records to the agent through its Client. Make one with
// Client.Handler; WithAttrs and WithGroup derive others as slog does.
type Handler struct {
	c            *Client
	level        slog.Leveler
	logger       []byte // `,"logger":"…"` or nothing
	afterMessage []byte // `,"process":…`
	addSource    bool
	contextAttrs func(context.Context) []slog.Attr

	pre     []byte   // fields encoded once: Fields, then WithAttrs; each starts with ','
	preRep  int      // characters replaced while encoding pre
	groups  []string // WithGroup names, outermost first; never appended to in place
	opened  int      // groups[:opened] were opened in pre
	hoisted hoisted  // trace_id and span_id given to WithAttrs
}

// hoisted holds the trace_id and span_id attributes, written once at the top level of the record
// wherever they were given (in a group, through WithAttrs, from the context).
type hoisted struct {
	traceID, spanID       slog.Value
	hasTraceID, hasSpanID bool
}

// Handler returns a slog.Handler writing to this client. opts may be nil.
func (c *Client) Handler(opts *HandlerOptions) *Handler {
	if opts == nil {
		opts = &HandlerOptions{}
	}
	h := &Handler{c: c, level: opts.Level, addSource: opts.AddSource, contextAttrs: opts.ContextAttrs}
	if h.level == nil {
		h.level = slog.LevelInfo
	}
	var replaced int
	if opts.Logger != "" {
		h.logger = appendString([]byte(`,"logger":`), opts.Logger, &replaced)
	}
	h.afterMessage = strconv.AppendInt([]byte(`,"process":`), int64(os.Getpid()), 10)
	if len(opts.Fields) > 0 {
		keys := make([]string, 0, len(opts.Fields))
		for key := range opts.Fields {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		attrs := make([]slog.Attr, len(keys))
		for i, key := range keys {
			attrs[i] = slog.Any(key, opts.Fields[key])
		}
		h = h.withAttrs(attrs)
	}
	h.preRep += replaced
	return h
}

// Enabled reports whether a record at level would be handled.
func (h *Handler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= h.level.Level()
}

// Handle encodes r and enqueues it. It never waits for the agent and always returns nil: a record
// that cannot be queued is counted (Client.Stats), not reported to the caller.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	e := getEncoder()
	defer putEncoder(e)
	if !h.encode(ctx, e, r) {
		h.c.q.dropFormatError(r.Level)
		return nil
	}
	record, truncated := e.buf, false
	if len(record) > h.c.cfg.maxRecordSize {
		record, truncated = fitRecord(record, h.c.cfg.maxRecordSize), true
	}
	at := r.Time
	if at.IsZero() {
		at = time.Now()
	}
	h.c.enqueue(record, r.Level, e.rep > 0, truncated, at)
	return nil
}

// encode writes the record into e.buf; false if encoding panicked (a bug here).
func (h *Handler) encode(ctx context.Context, e *encoder, r slog.Record) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	e.buf = append(e.buf, '{')
	if !r.Time.IsZero() {
		e.buf = append(e.buf, `"time":`...)
		e.buf = appendTime(e.buf, r.Time)
	}
	e.comma()
	e.buf = append(e.buf, `"level":`...)
	e.buf = appendString(e.buf, levelName(r.Level), &e.rep)
	e.buf = append(e.buf, h.logger...)
	e.buf = append(e.buf, `,"message":`...)
	e.buf = appendString(e.buf, r.Message, &e.rep)
	e.buf = append(e.buf, h.afterMessage...)
	if h.contextAttrs != nil {
		for _, a := range h.contextAttrs(ctx) {
			e.attr(a)
		}
	}
	// Precedence for the trace ids: the record's own, then WithAttrs', then the context's.
	if h.hoisted.hasTraceID {
		e.hoisted.traceID, e.hoisted.hasTraceID = h.hoisted.traceID, true
	}
	if h.hoisted.hasSpanID {
		e.hoisted.spanID, e.hoisted.hasSpanID = h.hoisted.spanID, true
	}
	e.buf = append(e.buf, h.pre...)
	e.rep += h.preRep
	e.frames = append(e.frames[:0], h.groups...)
	e.opened = h.opened
	r.Attrs(func(a slog.Attr) bool {
		e.attr(a)
		return true
	})
	for ; e.opened > 0; e.opened-- {
		e.buf = append(e.buf, '}')
	}
	e.frames = e.frames[:0]
	if e.hoisted.hasTraceID {
		e.buf = append(e.buf, `,"trace_id":`...)
		e.value(e.hoisted.traceID)
	}
	if e.hoisted.hasSpanID {
		e.buf = append(e.buf, `,"span_id":`...)
		e.value(e.hoisted.spanID)
	}
	if h.addSource && r.PC != 0 {
		frame, _ := runtime.CallersFrames([]uintptr{r.PC}).Next()
		e.buf = append(e.buf, `,"source":{"function":`...)
		e.buf = appendString(e.buf, frame.Function, &e.rep)
		e.buf = append(e.buf, `,"file":`...)
		e.buf = appendString(e.buf, frame.File, &e.rep)
		e.buf = append(e.buf, `,"line":`...)
		e.buf = strconv.AppendInt(e.buf, int64(frame.Line), 10)
		e.buf = append(e.buf, '}')
	}
	e.buf = append(e.buf, '}')
	return true
}

// WithAttrs returns a handler whose records carry attrs, encoded once here.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return h.withAttrs(attrs)
}

func (h *Handler) withAttrs(attrs []slog.Attr) *Handler {
	e := &encoder{
		buf:     append([]byte(nil), h.pre...),
		frames:  append([]string(nil), h.groups...),
		opened:  h.opened,
		hoisted: h.hoisted,
	}
	for _, a := range attrs {
		e.attr(a)
	}
	h2 := *h
	h2.pre, h2.preRep, h2.opened, h2.hoisted = e.buf, h.preRep+e.rep, e.opened, e.hoisted
	return &h2
}

// WithGroup returns a handler that nests the record's attributes (and later WithAttrs') under
// name. Beyond 16 levels it adds none (the agent refuses deep records).
func (h *Handler) WithGroup(name string) slog.Handler {
	if name == "" || len(h.groups) >= maxGroupDepth {
		return h
	}
	h2 := *h
	h2.groups = append(append(make([]string, 0, len(h.groups)+1), h.groups...), name)
	return &h2
}

// --- The encoder ------------------------------------------------------------------------------

// encoder is the state of encoding one record (or one WithAttrs call).
type encoder struct {
	buf    []byte
	rep    int      // characters replaced by U+FFFD
	frames []string // the groups the next attribute is in
	opened int      // frames[:opened] are opened in buf; the others open with their first field
	hoisted
}

var encoders = sync.Pool{New: func() any { return &encoder{buf: make([]byte, 0, 1024)} }}

func getEncoder() *encoder { return encoders.Get().(*encoder) }

func putEncoder(e *encoder) {
	if cap(e.buf) > maxPooledBuffer {
		return
	}
	e.buf, e.rep, e.frames, e.opened, e.hoisted = e.buf[:0], 0, e.frames[:0], 0, hoisted{}
	encoders.Put(e)
}

// comma separates the next field from the one before, if there is one.
func (e *encoder) comma() {
	if n := len(e.buf); n == 0 || e.buf[n-1] != '{' {
		e.buf = append(e.buf, ',')
	}
}

// key writes the key of the next field, first opening the groups it is in.
func (e *encoder) key(k string) {
	for e.opened < len(e.frames) {
		e.comma()
		e.buf = appendString(e.buf, fieldName(e.frames[e.opened], e.opened == 0), &e.rep)
		e.buf = append(e.buf, ':', '{')
		e.opened++
	}
	e.comma()
	e.buf = appendString(e.buf, fieldName(k, len(e.frames) == 0), &e.rep)
	e.buf = append(e.buf, ':')
}

// fieldName keeps an attribute from taking the place of a field this package writes: at the top
// level, "level" becomes "extra.level" (the Python client's rule for extra fields).
func fieldName(key string, top bool) string {
	if top {
		switch key {
		case "time", "level", "logger", "message", "process", "source", "trace_id", "span_id",
			"truncated", "elided_fields":
			return "extra." + key
		}
	}
	return key
}

func (e *encoder) attr(a slog.Attr) {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		attrs := v.Group()
		switch {
		case len(attrs) == 0: // slog: an empty group is left out
		case a.Key == "": // slog: a group without a key is inlined
			for _, member := range attrs {
				e.attr(member)
			}
		case len(e.frames) >= maxGroupDepth:
			e.key(a.Key)
			e.buf = appendString(e.buf, v.String(), &e.rep)
		default:
			e.frames = append(e.frames, a.Key)
			for _, member := range attrs {
				e.attr(member)
			}
			if e.opened == len(e.frames) {
				e.buf = append(e.buf, '}')
				e.opened--
			}
			e.frames = e.frames[:len(e.frames)-1]
		}
		return
	}
	switch {
	case a.Key == "" && v.Kind() == slog.KindAny && v.Any() == nil: // slog: the zero Attr is left out
	case a.Key == "trace_id":
		e.hoisted.traceID, e.hoisted.hasTraceID = v, true
	case a.Key == "span_id":
		e.hoisted.spanID, e.hoisted.hasSpanID = v, true
	default:
		e.key(a.Key)
		e.value(v)
	}
}

func (e *encoder) value(v slog.Value) {
	switch v.Kind() {
	case slog.KindString:
		e.buf = appendString(e.buf, v.String(), &e.rep)
	case slog.KindInt64:
		e.buf = strconv.AppendInt(e.buf, v.Int64(), 10)
	case slog.KindUint64:
		e.buf = strconv.AppendUint(e.buf, v.Uint64(), 10)
	case slog.KindFloat64:
		e.float(v.Float64())
	case slog.KindBool:
		e.buf = strconv.AppendBool(e.buf, v.Bool())
	case slog.KindDuration:
		e.buf = appendString(e.buf, v.Duration().String(), &e.rep)
	case slog.KindTime:
		e.buf = append(e.buf, '"')
		e.buf = v.Time().AppendFormat(e.buf, time.RFC3339Nano)
		e.buf = append(e.buf, '"')
	case slog.KindAny:
		e.any(v.Any())
	default: // a group where a value is due (a trace id given as a group): its text
		e.buf = appendString(e.buf, v.String(), &e.rep)
	}
}

// float writes f; JSON has no NaN or infinities, so those are strings ("NaN", "+Inf").
func (e *encoder) float(f float64) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		e.buf = appendString(e.buf, strconv.FormatFloat(f, 'g', -1, 64), &e.rep)
		return
	}
	e.buf = strconv.AppendFloat(e.buf, f, 'g', -1, 64)
}

// any writes a value of any type: an error with its chain, bytes as text, a json.Marshaler or
// encoding.TextMarshaler as it says, a fmt.Stringer as its String, anything else as
// encoding/json writes it. A method that panics leaves "!PANIC: …" in its place.
func (e *encoder) any(x any) {
	start := len(e.buf)
	defer func() {
		if p := recover(); p != nil {
			e.buf = appendString(e.buf[:start], fmt.Sprintf("!PANIC: %v", p), &e.rep)
		}
	}()
	switch x := x.(type) {
	case nil:
		e.buf = append(e.buf, "null"...)
	case error:
		e.errorValue(x)
	case []byte:
		e.buf = appendString(e.buf, string(x), &e.rep)
	case json.Marshaler:
		e.marshaled(x)
	case encoding.TextMarshaler:
		text, err := x.MarshalText()
		if err != nil {
			e.buf = appendString(e.buf, "!ERROR: "+err.Error(), &e.rep)
			return
		}
		e.buf = appendString(e.buf, string(text), &e.rep)
	case fmt.Stringer:
		e.buf = appendString(e.buf, x.String(), &e.rep)
	default:
		e.marshaled(x)
	}
}

// marshaled writes x as encoding/json does, made storable; if that would nest the record deeper
// than the agent allows, or x cannot be marshaled, its text instead.
func (e *encoder) marshaled(x any) {
	raw, err := json.Marshal(x)
	if err != nil {
		e.buf = appendString(e.buf, fmt.Sprintf("%+v", x), &e.rep)
		return
	}
	start := len(e.buf)
	var depth int
	e.buf, depth = sanitizeJSON(e.buf, raw, &e.rep)
	if 1+len(e.frames)+depth > maxJSONDepth {
		e.buf = appendString(e.buf[:start], string(raw), &e.rep)
	}
}

// errorValue writes err as {"message": err.Error(), "type": "*pkg.T", "chain": [{"type", "message"},
// …]}: "chain" lists what err wraps (errors.Unwrap, and every branch of errors.Join or
// fmt.Errorf with several %w), outermost first, so the root cause is last; absent if nothing.
func (e *encoder) errorValue(err error) {
	e.buf = append(e.buf, `{"message":`...)
	e.buf = appendString(e.buf, err.Error(), &e.rep)
	e.buf = append(e.buf, `,"type":`...)
	e.buf = appendString(e.buf, fmt.Sprintf("%T", err), &e.rep)
	chain := unwrapAll(nil, err)
	if len(chain) > 0 {
		e.buf = append(e.buf, `,"chain":[`...)
		for i, wrapped := range chain {
			if i > 0 {
				e.buf = append(e.buf, ',')
			}
			e.buf = append(e.buf, `{"type":`...)
			e.buf = appendString(e.buf, fmt.Sprintf("%T", wrapped), &e.rep)
			e.buf = append(e.buf, `,"message":`...)
			e.buf = appendString(e.buf, wrapped.Error(), &e.rep)
			e.buf = append(e.buf, '}')
		}
		e.buf = append(e.buf, ']')
	}
	e.buf = append(e.buf, '}')
}

// unwrapAll appends what err wraps, depth first, at most maxChain errors (an error that wraps
// itself ends there).
func unwrapAll(chain []error, err error) []error {
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, wrapped := range u.Unwrap() {
			if wrapped == nil || len(chain) >= maxChain {
				continue
			}
			chain = unwrapAll(append(chain, wrapped), wrapped)
		}
	case interface{ Unwrap() error }:
		if wrapped := u.Unwrap(); wrapped != nil && len(chain) < maxChain {
			chain = unwrapAll(append(chain, wrapped), wrapped)
		}
	}
	return chain
}
