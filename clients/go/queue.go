package sluice

// The bounded queue between the logging call and the sender, and every counter.
//
// Owns: the records held — sent on the current connection and awaiting their acknowledgement
// (the first `inflight` entries, acknowledged mode only), then those waiting to be sent — and
// the bound on all of them together, in records and in bytes; the drop policy; the counters
// Stats reports (report.go reads them out).
//
// Must not: block the caller beyond its one mutex, held for a few field updates and an append
// (no I/O, no allocation beyond growing the ring); evict a record once it is queued (only the
// incoming record is ever dropped, so a record awaiting its ACK is never lost to make room);
// touch a socket.
//
// Entries hold consecutive numbers (seq) from the front to the back: callers append at the back,
// the sender and the ACK reader remove from the front only, and Close clears everything. So the
// entry numbered n is at index n - front.seq.

import (
	"log/slog"
	"sync"
	"time"
)

// entry is one record in the queue.
type entry struct {
	// seq is the client's number for the record in its session (assigned at enqueue, kept across
	// resends); timeUs the time it was logged, Unix microseconds. In acknowledged mode both go to
	// the agent (SLUICE/2), so a record sent again after a reconnect is the same record.
	seq    uint64
	timeUs int64
	data   []byte // the record and its newline; never changed once queued
	level  slog.Level
	report bool // the in-band "dropped" report, not an application record
	// refused: the reason of the agent's NAK for its last send. It keeps its place until an ACK
	// covers it, so that the numbers sent after a reconnect stay consecutive, and is counted then,
	// by the last answer it got. resent: an earlier send's connection broke before it was
	// settled, so that send may have been stored (a send answered NAK was not).
	refused string
	resent  bool
}

type dropKey struct {
	reason DropReason
	level  string
}

// queue is shared by the callers, the sender and the ACK reader; see the file comment.
type queue struct {
	mu sync.Mutex

	ring     []entry // a ring buffer; len is a power of two
	head     int     // index of the front entry in ring
	n        int     // entries held
	inflight int     // the first inflight entries were sent on the current connection
	bytes    int     // bytes of all n entries
	inBytes  int     // bytes of the inflight entries

	maxRecords, maxBytes   int
	highRecords, highBytes int

	seq     uint64 // the last number given
	gen     uint64 // the current connection; ACKs of another one are stale
	session string // this client's session (SLUICE/2), a UUIDv7

	closed, stopping bool
	senderWaiting    bool
	// lingering: the sender lets a burst gather (sender.linger) until lingerRecords records or
	// lingerBytes bytes are queued; the record that crosses the mark wakes it.
	lingering                  bool
	lingerRecords, lingerBytes int
	flushers                   int           // Flush and Close callers waiting: the sender does not linger
	wake                       chan struct{} // capacity 1: sent to without blocking
	settled                    chan struct{} // closed when entries leave the queue; nil if nobody waits

	now func() time.Time // the clock; tests replace it

	sent, acknowledged, replaced, truncated uint64
	reconnects, unconfirmed, reportsSent    uint64
	progress                                uint64 // entries settled: tells a stalled agent from a slow one
	dropped                                 map[dropKey]uint64
	naks                                    map[string]uint64
	connected                               bool
	ackPoint, lastError                     string

	// Drops not yet reported in band, and not yet on stderr.
	unreported      map[dropKey]uint64
	unreportedSince time.Time
	unnoticed       uint64
	noticeAt        time.Time
}

func newQueue(maxRecords, maxBytes int, highWater float64) *queue {
	return &queue{
		ring:        make([]entry, 64),
		maxRecords:  maxRecords,
		maxBytes:    maxBytes,
		highRecords: int(float64(maxRecords) * highWater),
		highBytes:   int(float64(maxBytes) * highWater),
		session:     uuid7Hex(),
		wake:        make(chan struct{}, 1),
		now:         time.Now,
		dropped:     make(map[dropKey]uint64),
		naks:        make(map[string]uint64),
		unreported:  make(map[dropKey]uint64),
	}
}

// at is the i-th entry from the front.
func (q *queue) at(i int) *entry {
	return &q.ring[(q.head+i)&(len(q.ring)-1)]
}

func (q *queue) pushBack(e entry) {
	if q.n == len(q.ring) {
		grown := make([]entry, 2*len(q.ring))
		for i := 0; i < q.n; i++ {
			grown[i] = *q.at(i)
		}
		q.ring, q.head = grown, 0
	}
	*q.at(q.n) = e
	q.n++
	q.bytes += len(e.data)
}

func (q *queue) popFront() entry {
	slot := q.at(0)
	e := *slot
	*slot = entry{} // let the collector have the record
	q.head = (q.head + 1) & (len(q.ring) - 1)
	q.n--
	q.bytes -= len(e.data)
	q.progress++
	return e
}

// --- The caller's side ------------------------------------------------------------------------

// offer enqueues one record or drops it and counts why; it never waits beyond the mutex.
func (q *queue) offer(data []byte, level slog.Level, replaced, truncated bool, timeUs int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if replaced {
		q.replaced++
	}
	if truncated {
		q.truncated++
	}
	count := q.n + 1
	total := q.bytes + len(data)
	switch {
	case q.closed:
		q.drop(DropClosed, level, 1)
		return false
	case count > q.maxRecords || total > q.maxBytes:
		q.drop(DropFull, level, 1)
		return false
	case level < slog.LevelWarn && (count > q.highRecords || total > q.highBytes):
		q.drop(DropHighWater, level, 1)
		return false
	}
	q.seq++
	q.pushBack(entry{seq: q.seq, timeUs: timeUs, data: data, level: level})
	q.wakeSender()
	if q.lingering && (q.n-q.inflight >= q.lingerRecords || q.bytes-q.inBytes >= q.lingerBytes) {
		q.lingering = false // one wake-up ends it
		q.wakeLinger()
	}
	return true
}

// dropFormatError counts a record that could not be encoded.
func (q *queue) dropFormatError(level slog.Level) {
	q.mu.Lock()
	q.drop(DropFormatError, level, 1)
	q.mu.Unlock()
}

func (q *queue) drop(reason DropReason, level slog.Level, count uint64) {
	key := dropKey{reason, levelName(level)}
	q.dropped[key] += count
	q.unreported[key] += count
	if q.unreportedSince.IsZero() {
		q.unreportedSince = q.now()
	}
	if q.unnoticed == 0 {
		q.wakeSender() // the sender writes the stderr line
	}
	q.unnoticed += count
}

// wakeSender makes the sender look at the queue again, if it waits. The channel has room for
// one wake-up; a second one is not needed, so the send never blocks.
func (q *queue) wakeSender() {
	if q.senderWaiting {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// broadcastSettled wakes Flush and Close waiting for the queue to empty.
func (q *queue) broadcastSettled() {
	if q.settled != nil {
		close(q.settled)
		q.settled = nil
	}
}

// --- The sender's side ------------------------------------------------------------------------

// readyOrWait says whether the sender has work (records to send, a stderr notice due, or a
// stop); if not, it marks the sender as waiting so that the next record wakes it.
func (q *queue) readyOrWait() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addReport()
	if q.n > q.inflight || q.stopping || q.noticeDue() {
		return true
	}
	q.senderWaiting = true
	return false
}

func (q *queue) doneWaiting() {
	q.mu.Lock()
	q.senderWaiting = false
	q.mu.Unlock()
}

// hasPending says whether records wait to be sent.
func (q *queue) hasPending() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n > q.inflight
}

// startLinger says whether the sender should let a burst gather: not while Flush or Close
// waits, nor once records or bytes are queued. If so, the record that reaches either mark wakes
// it (endLinger when it is done). A wake-up left from before is taken first.
func (q *queue) startLinger(records, bytes int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stopping || q.flushers > 0 || q.n-q.inflight >= records || q.bytes-q.inBytes >= bytes {
		return false
	}
	select {
	case <-q.wake:
	default:
	}
	q.lingering, q.lingerRecords, q.lingerBytes = true, records, bytes
	return true
}

// wakeLinger ends the sender's linger; like wakeSender, it never blocks.
func (q *queue) wakeLinger() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue) endLinger() {
	q.mu.Lock()
	q.lingering = false
	q.mu.Unlock()
}

// connectionOpened records that a connection is up and returns its generation.
func (q *queue) connectionOpened(ackPoint string, reconnect bool) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.gen++
	q.connected = true
	q.ackPoint = ackPoint
	q.lastError = ""
	if reconnect {
		q.reconnects++
	}
	return q.gen
}

// connectionLost records that the connection of generation gen is gone: what it had not settled
// is waiting to be sent again, in order, from the front. Idempotent.
func (q *queue) connectionLost(gen uint64, errText string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if errText != "" {
		q.lastError = errText
	}
	if gen != q.gen {
		return
	}
	q.gen++
	q.connected = false
	for i := 0; i < q.inflight; i++ {
		// Sent again: the next connection's answer decides how it is counted.
		e := q.at(i)
		if e.refused == "" {
			e.resent = true
		}
		e.refused = ""
	}
	q.inflight = 0
	q.inBytes = 0
	q.wakeSender()
}

func (q *queue) connectFailed(errText string) {
	q.mu.Lock()
	q.lastError = errText
	q.mu.Unlock()
}

// firstUnsettled is the number a new connection starts at (SLUICE/2 ACK … first=): the first
// record not acknowledged, or the next one to be queued.
func (q *queue) firstUnsettled() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n > 0 {
		return q.at(0).seq
	}
	return q.seq + 1
}

// batchEntry is what the sender needs of an entry to write it.
type batchEntry struct {
	seq    uint64
	timeUs int64
	data   []byte
}

// peek (plain mode) appends to dst the first records to write, leaving them queued — and in the
// bound — until commit says they were written.
func (q *queue) peek(dst []batchEntry, maxRecords, maxBytes int) []batchEntry {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addReport()
	return q.front(dst, 0, maxRecords, maxBytes)
}

// commit (plain mode): the first count records of the last peek are in the socket.
func (q *queue) commit(count int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stopping { // Close cleared the queue and counted them
		return
	}
	for i := 0; i < count && q.n > 0; i++ {
		q.countSent(q.popFront())
	}
	q.broadcastSettled()
}

// takeNumbered (acknowledged mode) marks the first records waiting as sent on connection gen
// and appends them to dst; nothing if that connection is gone already.
func (q *queue) takeNumbered(dst []batchEntry, gen uint64, maxRecords, maxBytes int) []batchEntry {
	q.mu.Lock()
	defer q.mu.Unlock()
	if gen != q.gen || q.stopping {
		return dst
	}
	q.addReport()
	start := len(dst)
	dst = q.front(dst, q.inflight, maxRecords, maxBytes)
	for range dst[start:] {
		e := q.at(q.inflight)
		q.inflight++
		q.inBytes += len(e.data)
		q.countSent(*e)
	}
	return dst
}

func (q *queue) front(dst []batchEntry, from, maxRecords, maxBytes int) []batchEntry {
	size := 0
	for i := from; i < q.n; i++ {
		e := q.at(i)
		if i > from && (i-from >= maxRecords || size+len(e.data) > maxBytes) {
			break
		}
		dst = append(dst, batchEntry{seq: e.seq, timeUs: e.timeUs, data: e.data})
		size += len(e.data)
	}
	return dst
}

func (q *queue) countSent(e entry) {
	if e.report {
		q.reportsSent++
	} else {
		q.sent++
	}
}

// --- The ACK reader's side --------------------------------------------------------------------

// ack: every record up to number, sent on connection gen, is settled.
func (q *queue) ack(gen, number uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if gen != q.gen {
		return
	}
	for q.inflight > 0 && q.at(0).seq <= number {
		e := q.popFront()
		q.inflight--
		q.inBytes -= len(e.data)
		switch {
		case e.report:
		case e.refused == "":
			q.acknowledged++
		default:
			q.countRefused(e)
		}
	}
	q.broadcastSettled()
}

// countRefused counts a record whose last send was refused: a NAK by its reason, or unconfirmed
// if an earlier send's connection broke unsettled (that send may have been stored).
func (q *queue) countRefused(e entry) {
	if e.resent {
		q.unconfirmed++
	} else {
		q.naks[e.refused]++
	}
}

// nak: the record numbered number was refused. It is never sent again on its own account, and
// is counted when the ACK that follows settles it (or the sender stops).
func (q *queue) nak(gen, number uint64, reason string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if gen != q.gen || q.inflight == 0 || number < q.at(0).seq {
		return
	}
	i := number - q.at(0).seq
	if i >= uint64(q.inflight) {
		return
	}
	if e := q.at(int(i)); e.refused == "" {
		e.refused = reason
	}
}

// --- Flush and Close --------------------------------------------------------------------------

// waitSettled waits until nothing is queued or awaiting an acknowledgement; false if done
// closed first.
func (q *queue) waitSettled(done <-chan struct{}) bool {
	q.mu.Lock()
	q.flushers++
	if q.lingering {
		q.lingering = false
		q.wakeLinger() // the sender writes now
	}
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		q.flushers--
		q.mu.Unlock()
	}()
	for {
		q.mu.Lock()
		if q.n == 0 {
			q.mu.Unlock()
			return true
		}
		if q.settled == nil {
			q.settled = make(chan struct{})
		}
		settled := q.settled
		q.mu.Unlock()
		select {
		case <-settled:
		case <-done:
			return false
		}
	}
}

func (q *queue) progressCount() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.progress
}

// close refuses new records from now on (each counted closed).
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}

// stop ends the sender's work; what is left is counted: queued as dropped closed, sent and not
// settled as unconfirmed (the agent may have stored it).
func (q *queue) stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.stopping = true
	for i := 0; i < q.n; i++ {
		e := q.at(i)
		switch {
		case e.report:
		case i < q.inflight && e.refused != "":
			q.countRefused(*e)
		case i < q.inflight:
			q.unconfirmed++
		default:
			q.drop(DropClosed, e.level, 1)
		}
	}
	for q.n > 0 {
		q.popFront()
	}
	q.inflight, q.inBytes = 0, 0
	q.broadcastSettled()
	q.wakeSender()
}
