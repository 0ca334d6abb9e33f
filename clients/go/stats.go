package sluice

// DropReason says why the client dropped a record. The same word is the key of
// [Stats.Dropped], of "by_reason" in the in-band report and of the stderr notice.
type DropReason string

const (
	// DropFull: the queue held its maximum records or bytes (WithMaxQueueRecords,
	// WithMaxQueueBytes), counting records sent and awaiting an acknowledgement.
	DropFull DropReason = "full"
	// DropHighWater: a record below slog.LevelWarn arrived while the queue was above its high-water
	// mark (WithDropBelowWarnAt), which keeps the rest of the room for warnings and errors.
	DropHighWater DropReason = "high_water"
	// DropClosed: logged after Close, or still queued when Close stopped waiting.
	DropClosed DropReason = "closed"
	// DropFormatError: the record could not be encoded (a bug in this package; a value whose
	// String or MarshalJSON panics is rendered as "!PANIC: …" instead).
	DropFormatError DropReason = "format_error"
)

// Stats are the client's counters since New. Counts of records are of the application's
// records; the in-band drop reports are counted apart (ReportsSent).
type Stats struct {
	// Queued records wait to be sent, and take QueuedBytes.
	Queued      int
	QueuedBytes int
	// Unacknowledged records were sent and await the agent's ACK (acknowledged mode).
	Unacknowledged      int
	UnacknowledgedBytes int
	// Sent counts records written to the socket, each time it was written (a record sent again
	// after a reconnect counts again). Acknowledged counts records the agent acknowledged.
	Sent         uint64
	Acknowledged uint64
	// Dropped counts dropped records by reason, then by level name ("info", "warn", …).
	Dropped      map[DropReason]map[string]uint64
	DroppedTotal uint64
	// NAK counts records the agent refused (acknowledged mode), by the agent's reason
	// ("too_large", "rate_limited", "drop_newest", …).
	NAK map[string]uint64
	// Replaced counts records in which characters were replaced by U+FFFD; Truncated, records cut
	// to the listener's max_record_size.
	Replaced  uint64
	Truncated uint64
	// Reconnects counts connections made after the first.
	Reconnects uint64
	// Unconfirmed counts records sent and never acknowledged when Close stopped waiting: the
	// agent may have stored them.
	Unconfirmed uint64
	// ReportsSent counts in-band "dropped" reports sent.
	ReportsSent uint64
	// Connected: a connection to the agent is up. AckPoint is the agent's answer to the
	// acknowledged-mode handshake ("spooled", "delivered"). LastError is the last connection
	// error ("ENOENT", "ECONNREFUSED", …), cleared by a successful connection.
	Connected bool
	AckPoint  string
	LastError string
}
