// Package sluice ships an application's log records to the Sluice agent, the sidecar listening
// on a Unix socket in the pod, one JSON line per record (docs/PROTOCOL.md, the lines protocol).
//
//	client, err := sluice.New("/run/sluice/sluice.sock")
//	if err != nil { ... }                   // only for invalid options: the agent may be absent
//	defer client.Close(context.Background()) // drains for at most 2 s
//	slog.SetDefault(slog.New(client.Handler(&sluice.HandlerOptions{Logger: "shop"})))
//
// Or for zap, zerolog and the log package, [Client.Writer].
//
// What it owns: a bounded queue (records and bytes, counting records sent and awaiting an
// acknowledgement), its drop policy and every counter ([Client.Stats]); one sender goroutine,
// the only code that touches the socket, which dials lazily and reconnects forever with jittered
// backoff; in acknowledged mode a client session (SLUICE/2) whose records keep their numbers and
// times when they are sent again after a reconnect; the record format, and cutting or repairing
// records the agent would refuse.
//
// What it must never do: make the logging call wait — [Handler.Handle] and [Client.Writer]'s
// Write encode, take one mutex for an in-memory append, and return; no socket call, no dial, no
// channel send that can block, no stderr write on the caller's goroutine. Nor may it log through
// the application's logger (its own notices go to stderr, at most one line a minute), evict a
// record already queued, or wait in Flush or Close beyond their deadlines.
package sluice
