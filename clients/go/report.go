package sluice

// What the queue tells about itself: the in-band "dropped" record, the stderr notice (at most one
// a minute), Close's summary, and Stats. Every function here runs with the queue's mutex (taking
// it, or called with it held), and none does I/O: the sender writes what they return.

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"
)

// noticeInterval is how often, at most, a line about drops goes to stderr.
const noticeInterval = time.Minute

// addReport queues the in-band "dropped" record if drops are unreported, a connection is up (so
// that an outage makes one report, not one per attempt) and there is room. Called with mu held.
func (q *queue) addReport() {
	if len(q.unreported) == 0 || !q.connected || q.closed {
		return
	}
	byReason := map[string]uint64{}
	byLevel := map[string]uint64{}
	var total uint64
	for key, count := range q.unreported {
		byReason[string(key.reason)] += count
		byLevel[key.level] += count
		total += count
	}
	now := q.now()
	data := []byte(`{"time":`)
	data = appendTime(data, now)
	data = append(data, `,"level":"warn","logger":"sluice","message":"sluice client dropped `...)
	data = fmt.Appendf(data, `%d log records","sluice.client":"dropped","count":%d,"since":`, total, total)
	data = appendTime(data, q.unreportedSince)
	data = append(data, `,"by_reason":`...)
	data = appendCounts(data, byReason)
	data = append(data, `,"by_level":`...)
	data = appendCounts(data, byLevel)
	data = append(data, "}\n"...)
	if q.n+1 > q.maxRecords || q.bytes+len(data) > q.maxBytes {
		return // no room yet: it waits, and keeps counting
	}
	q.seq++
	q.pushBack(entry{seq: q.seq, timeUs: now.UnixMicro(), data: data, level: slog.LevelWarn, report: true})
	clear(q.unreported)
	q.unreportedSince = time.Time{}
}

// appendCounts appends counts as a JSON object, keys sorted.
func appendCounts(dst []byte, counts map[string]uint64) []byte {
	keys := make([]string, 0, len(counts))
	for key := range counts {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	dst = append(dst, '{')
	var replaced int
	for i, key := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, key, &replaced)
		dst = fmt.Appendf(dst, ":%d", counts[key])
	}
	return append(dst, '}')
}

func (q *queue) noticeDue() bool {
	return q.unnoticed > 0 && !q.now().Before(q.noticeAt)
}

// noticeDueIn is how long until a pending stderr notice may be written; false if none is pending.
func (q *queue) noticeDueIn() (time.Duration, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.unnoticed == 0 {
		return 0, false
	}
	return max(0, q.noticeAt.Sub(q.now())), true
}

// takeNotice returns the stderr line about drops if one is due (at most one a minute).
func (q *queue) takeNotice(socketPath string) (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.noticeDue() || q.stopping { // Close writes its summary instead
		return "", false
	}
	count := q.unnoticed
	q.unnoticed = 0
	q.noticeAt = q.now().Add(noticeInterval)
	return fmt.Sprintf("sluice: dropped %d log record(s) since the last notice (total by reason: %s); agent %s: %s\n",
		count, q.reasonsLocked(), socketPath, q.stateLocked()), true
}

// reasonsLocked is "full=3, high_water=2": every drop so far by reason.
func (q *queue) reasonsLocked() string {
	byReason := map[string]uint64{}
	for key, count := range q.dropped {
		byReason[string(key.reason)] += count
	}
	return formatCounts(byReason)
}

func formatCounts(counts map[string]uint64) string {
	parts := make([]string, 0, len(counts))
	for key, count := range counts {
		parts = append(parts, fmt.Sprintf("%s=%d", key, count))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func (q *queue) stateLocked() string {
	if q.connected {
		return "connected"
	}
	if q.lastError == "" {
		return "not connected (not tried yet)"
	}
	return "not connected (" + q.lastError + ")"
}

// summary is the line Close writes to stderr when records were lost; false if none was.
func (q *queue) summary(socketPath string) (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var dropped, refused uint64
	for _, count := range q.dropped {
		dropped += count
	}
	for _, count := range q.naks {
		refused += count
	}
	if dropped == 0 && refused == 0 && q.unconfirmed == 0 {
		return "", false
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sluice: closed; %d log record(s) sent", q.sent)
	if q.acknowledged > 0 || refused > 0 || q.unconfirmed > 0 {
		fmt.Fprintf(&b, ", %d acknowledged", q.acknowledged)
	}
	if dropped > 0 {
		fmt.Fprintf(&b, ", %d dropped (%s)", dropped, q.reasonsLocked())
	}
	if refused > 0 {
		fmt.Fprintf(&b, ", %d refused by the agent (%s)", refused, formatCounts(q.naks))
	}
	if q.unconfirmed > 0 {
		fmt.Fprintf(&b, ", %d sent and never acknowledged (the agent may have stored them)", q.unconfirmed)
	}
	fmt.Fprintf(&b, "; agent %s", socketPath)
	if q.lastError != "" {
		fmt.Fprintf(&b, " (last error: %s)", q.lastError)
	}
	b.WriteString("\n")
	return b.String(), true
}

func (q *queue) stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := Stats{
		Queued:              q.n - q.inflight,
		QueuedBytes:         q.bytes - q.inBytes,
		Unacknowledged:      q.inflight,
		UnacknowledgedBytes: q.inBytes,
		Sent:                q.sent,
		Acknowledged:        q.acknowledged,
		Dropped:             map[DropReason]map[string]uint64{},
		NAK:                 map[string]uint64{},
		Replaced:            q.replaced,
		Truncated:           q.truncated,
		Reconnects:          q.reconnects,
		Unconfirmed:         q.unconfirmed,
		ReportsSent:         q.reportsSent,
		Connected:           q.connected,
		AckPoint:            q.ackPoint,
		LastError:           q.lastError,
	}
	for key, count := range q.dropped {
		if s.Dropped[key.reason] == nil {
			s.Dropped[key.reason] = map[string]uint64{}
		}
		s.Dropped[key.reason][key.level] = count
		s.DroppedTotal += count
	}
	for reason, count := range q.naks {
		s.NAK[reason] = count
	}
	return s
}
