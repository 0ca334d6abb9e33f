"""The bounded queue between the logging call and the sender thread, and every counter.

Owns: the records waiting to be sent (``pending``) and, in acknowledged mode, those sent on the
current connection and not yet settled (``unacked``, each with the number the agent gives it);
the bound on both together, in records and in bytes; the drop policy; every counter that
``SluiceHandler.stats()`` reports; the in-band "dropped" report and the stderr notice.

Must not: block the caller beyond taking its one lock for a few dictionary and deque
operations; evict a record once it is queued (only the incoming record is ever dropped, so a
record sent and awaiting its ``ACK`` is never lost to make room); touch a socket.

One lock (inside one ``threading.Condition``) guards everything here: the caller's ``offer``,
the sender's ``take``/``commit``, the ACK reader's ``ack``/``nak``, and ``flush``. The sender
removes from the front of ``pending`` only; callers append at its back only.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from typing import Callable, Deque, Dict, List, Optional, Tuple

from ._format import level_name, rfc3339

#: Drop reasons: the words ``stats()["dropped"]`` and the in-band report use.
FULL = "full"
"""The queue held ``max_queue_records`` records or ``max_queue_bytes`` bytes."""
HIGH_WATER = "high_water"
"""A record below WARNING arrived while the queue was above ``drop_below_warning_at``."""
CLOSED = "closed"
"""Logged after ``close()``, or still queued when ``close()`` gave up waiting."""
FORMAT_ERROR = "format_error"
"""Formatting the record raised (a bug in this library: the record could not be built)."""

#: How often, at most, a line about drops goes to stderr.
NOTICE_INTERVAL_SECONDS = 60.0


def uuid7_hex() -> str:
    """A UUIDv7 (RFC 9562: Unix milliseconds, then random bits) as 32 hex digits."""
    value = (int(time.time() * 1000) & ((1 << 48) - 1)) << 80
    value |= int.from_bytes(os.urandom(10), "big") & ((1 << 80) - 1)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # variant 10
    return f"{value:032x}"


class Entry:
    """One formatted record: its line (with the newline) and what drop accounting needs.

    ``seq`` is the client's own number for the record in its session (assigned at enqueue, one
    after the other, kept across resends) and ``time_us`` the time it was logged (Unix
    microseconds): in acknowledged mode both go to the agent (``SLUICE/2``), so a record sent
    again after a reconnect is the same record, one row. ``refused``: the reason of the agent's
    ``NAK`` for its last send (it stays in line until an ``ACK`` covers it, so the numbers sent
    after a reconnect stay consecutive, and is counted then: a record is counted by the last
    answer it got). ``resent``: an earlier send's connection broke before it was settled, so
    that send may have been stored (a send answered ``NAK`` was not).
    """

    __slots__ = ("seq", "data", "levelno", "report", "time_us", "refused", "resent")

    def __init__(self, seq: int, data: bytes, levelno: int, report: bool = False, time_us: int = 0) -> None:
        self.seq = seq
        self.data = data
        self.levelno = levelno
        self.report = report
        self.time_us = time_us
        self.refused: Optional[str] = None
        self.resent = False


class RecordQueue:
    """Bounded by records and bytes, whichever fills first; see the module docstring."""

    def __init__(
        self,
        max_records: int,
        max_bytes: int,
        drop_below_warning_at: Optional[float],
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._max_records = max_records
        self._max_bytes = max_bytes
        # Without the tier, the high-water marks are the bounds themselves (checked first).
        fraction = 1.0 if drop_below_warning_at is None else drop_below_warning_at
        self._high_records = int(max_records * fraction)
        self._high_bytes = int(max_bytes * fraction)
        self._clock = clock
        self._wall_clock = wall_clock
        self._reset()

    def _reset(self) -> None:
        """Fresh state: at construction, and in a forked child (whose queue is its parent's)."""
        self.cond = threading.Condition(threading.Lock())
        self._pending: Deque[Entry] = collections.deque()
        self._unacked: Deque[Tuple[int, Entry]] = collections.deque()
        self._bytes = 0  # of pending and unacked together
        self._unacked_bytes = 0
        self._seq = 0
        self._gen = 0  # the current connection; ACKs of another are stale
        # This process's session (SLUICE/2): a new one in a forked child.
        self.session = uuid7_hex()
        self._closed = False
        self._stopping = False
        self._sender_waiting = False
        # The sender lets a burst gather (``linger``) until this many records or bytes wait; the
        # record that crosses the mark wakes it. It does not while flush() or close() waits.
        self._lingering = False
        self._linger_records = 0
        self._linger_bytes = 0
        self._flushers = 0
        # Counters.
        self._sent = 0
        self._acknowledged = 0
        self._replaced = 0
        self._truncated = 0
        self._reconnects = 0
        self._unconfirmed = 0
        self._reports_sent = 0
        self._dropped: Dict[Tuple[str, str], int] = {}
        self._nak: Dict[str, int] = {}
        self._progress = 0  # anything settled: lets close() tell a stalled agent from a slow one
        self.connected = False
        self.ack_point: Optional[str] = None
        self.last_error: Optional[str] = None
        # Drops not yet reported in band, and not yet on stderr.
        self._unreported: Dict[Tuple[str, str], int] = {}
        self._unreported_since: Optional[float] = None
        self._unnoticed = 0
        self._notice_at = 0.0  # monotonic time before which no stderr line is written

    def reset_after_fork(self) -> None:
        """In a forked child: a new lock (the parent's may have been held by a thread that does
        not exist here), no records (the parent sends its own), counters from zero."""
        self._reset()

    # The caller's side. -----------------------------------------------------------------------

    def offer(self, data: bytes, levelno: int, replaced: bool, truncated: bool, time_us: int = 0) -> bool:
        """Enqueue one line, or drop it and count why; never waits beyond the lock."""
        size = len(data)
        with self.cond:
            if replaced:
                self._replaced += 1
            if truncated:
                self._truncated += 1
            count = len(self._pending) + len(self._unacked) + 1
            total = self._bytes + size
            if self._closed:
                self._drop(CLOSED, levelno)
                return False
            if count > self._max_records or total > self._max_bytes:
                self._drop(FULL, levelno)
                return False
            if levelno < logging.WARNING and (count > self._high_records or total > self._high_bytes):
                self._drop(HIGH_WATER, levelno)
                return False
            self._seq += 1
            self._pending.append(Entry(self._seq, data, levelno, time_us=time_us or int(self._wall_clock() * 1e6)))
            self._bytes = total
            if self._sender_waiting:
                self.cond.notify_all()
            elif self._lingering and (
                len(self._pending) >= self._linger_records or self._bytes - self._unacked_bytes >= self._linger_bytes
            ):
                self._lingering = False  # one notification ends it
                self.cond.notify_all()
            return True

    def drop(self, reason: str, levelno: int) -> None:
        """Count a record dropped before it could be offered (say, it failed to format)."""
        with self.cond:
            self._drop(reason, levelno)

    def _drop(self, reason: str, levelno: int, count: int = 1) -> None:
        key = (reason, level_name(levelno))
        self._dropped[key] = self._dropped.get(key, 0) + count
        self._unreported[key] = self._unreported.get(key, 0) + count
        if self._unreported_since is None:
            self._unreported_since = self._wall_clock()
        if self._unnoticed == 0 and self._sender_waiting:
            self.cond.notify_all()  # the sender writes the stderr line
        self._unnoticed += count

    # The sender's side. -----------------------------------------------------------------------

    def wait_for_work(self, timeout: float) -> None:
        """Wait until there is something to send, a stderr notice is due, or we are stopping."""
        with self.cond:
            self._add_report()
            if self._pending or self._stopping or self._notice_due():
                return
            self._sender_waiting = True
            try:
                self.cond.wait(timeout)
            finally:
                self._sender_waiting = False

    def linger(self, seconds: float, records: int, size: int) -> None:
        """The sender's pause once it has something to send: up to ``seconds``, so the records a
        burst logs meanwhile go in one write and wake the agent once, not once each (each wake-up
        also takes the GIL from the logging threads). Ends early once ``records`` records or
        ``size`` bytes wait (the call that crosses the mark notifies it; the calls before notify
        nobody), while flush() or close() waits, or at ``stop()``."""
        # Real time, not the injectable clock: a test's frozen clock must not make it wait forever.
        deadline = time.monotonic() + seconds
        with self.cond:
            self._linger_records, self._linger_bytes = records, size
            self._lingering = True
            try:
                while (
                    self._lingering
                    and not self._stopping
                    and self._flushers == 0
                    and len(self._pending) < records
                    and self._bytes - self._unacked_bytes < size
                ):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self.cond.wait(remaining)
            finally:
                self._lingering = False

    def sleep(self, seconds: float) -> None:
        """The sender's backoff: a wait that ``stop()`` cuts short."""
        with self.cond:
            if not self._stopping:
                self.cond.wait(seconds)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def has_pending(self) -> bool:
        with self.cond:
            return bool(self._pending)

    def connection_opened(self, ack_point: Optional[str], reconnect: bool) -> int:
        """A connection is up: number records from 1 again; returns its generation."""
        with self.cond:
            self._gen += 1
            self.connected = True
            self.ack_point = ack_point
            self.last_error = None
            if reconnect:
                self._reconnects += 1
            return self._gen

    def connection_lost(self, gen: int, error: Optional[str]) -> None:
        """The connection of generation ``gen`` is gone: what it had not settled goes back to
        the front of ``pending``, in order, to be sent again on the next one. Idempotent."""
        with self.cond:
            if error:
                self.last_error = error
            if gen != self._gen:
                return
            self._gen += 1
            self.connected = False
            if self._unacked:
                for _, entry in self._unacked:
                    # Sent again: the next connection's answer decides how it is counted. A
                    # send that was refused was not stored; one never answered may have been.
                    if entry.refused is None:
                        entry.resent = True
                    entry.refused = None
                self._pending.extendleft(entry for _, entry in reversed(self._unacked))
                self._unacked.clear()
                self._unacked_bytes = 0
            self.cond.notify_all()

    def connect_failed(self, error: str) -> None:
        with self.cond:
            self.last_error = error

    def _add_report(self) -> None:
        """Queue the in-band "dropped" record if drops are unreported, the sender is connected
        (so that an outage makes one report, not one per reconnect attempt) and there is room —
        never once closed: then every record is dropped ``closed``, a report per step would keep
        the queue from draining, and the summary at close tells the drops."""
        if not self._unreported or not self.connected or self._closed:
            return
        by_reason: Dict[str, int] = {}
        by_level: Dict[str, int] = {}
        for (reason, level), count in self._unreported.items():
            by_reason[reason] = by_reason.get(reason, 0) + count
            by_level[level] = by_level.get(level, 0) + count
        total = sum(by_reason.values())
        now = self._wall_clock()
        report = {
            "time": rfc3339(now),
            "level": "warn",
            "logger": "sluice_logging",
            "message": f"sluice client dropped {total} log records",
            "sluice.client": "dropped",
            "count": total,
            "since": rfc3339(self._unreported_since or now),
            "by_reason": by_reason,
            "by_level": by_level,
        }
        data = (json.dumps(report, separators=(",", ":")) + "\n").encode()
        if (
            len(self._pending) + len(self._unacked) + 1 > self._max_records
            or self._bytes + len(data) > self._max_bytes
        ):
            return  # no room yet: it waits, and keeps counting
        self._seq += 1
        self._pending.append(Entry(self._seq, data, logging.WARNING, report=True, time_us=int(now * 1e6)))
        self._bytes += len(data)
        self._unreported = {}
        self._unreported_since = None

    def peek(self, max_records: int, max_bytes: int) -> List[Entry]:
        """Plain mode: the first records to write, left in ``pending`` (and in the bound) until
        ``commit`` says they were written."""
        with self.cond:
            self._add_report()
            return self._front(max_records, max_bytes)

    def commit(self, written: List[Entry]) -> None:
        """Plain mode: these records, the first of the last ``peek``, are in the socket. (Those
        that ``stop()`` cleared meanwhile were counted by it.)"""
        with self.cond:
            for entry in written:
                if not self._pending or self._pending[0] is not entry:
                    break
                self._pending.popleft()
                self._bytes -= len(entry.data)
                self._count_sent(entry)
                self._progress += 1
            self.cond.notify_all()

    def take_numbered(self, gen: int, max_records: int, max_bytes: int) -> List[Entry]:
        """Acknowledged mode: move the first records to ``unacked`` (the agent answers with their
        ``seq``); empty if connection ``gen`` is gone already."""
        with self.cond:
            if gen != self._gen:
                return []
            self._add_report()
            batch = self._front(max_records, max_bytes)
            for entry in batch:
                self._pending.popleft()
                self._unacked.append((entry.seq, entry))
                self._unacked_bytes += len(entry.data)
                self._count_sent(entry)
            return batch

    def first_unsettled(self) -> int:
        """The number a new connection starts at (``SLUICE/2 ACK … first=``): the first record
        not acknowledged, or the next one to be queued."""
        with self.cond:
            if self._unacked:
                return self._unacked[0][0]
            if self._pending:
                return self._pending[0].seq
            return self._seq + 1

    def _front(self, max_records: int, max_bytes: int) -> List[Entry]:
        batch: List[Entry] = []
        size = 0
        for entry in self._pending:
            if batch and (len(batch) >= max_records or size + len(entry.data) > max_bytes):
                break
            batch.append(entry)
            size += len(entry.data)
        return batch

    def _count_sent(self, entry: Entry) -> None:
        if entry.report:
            self._reports_sent += 1
        else:
            self._sent += 1

    # The ACK reader's side. -------------------------------------------------------------------

    def ack(self, gen: int, number: int) -> None:
        """``ACK number``: every record up to ``number`` on connection ``gen`` is settled."""
        with self.cond:
            if gen != self._gen:
                return
            while self._unacked and self._unacked[0][0] <= number:
                _, entry = self._unacked.popleft()
                self._settle(entry)
                if entry.report:
                    continue
                if entry.refused is None:
                    self._acknowledged += 1
                else:
                    self._count_refused(entry)
            self.cond.notify_all()

    def nak(self, gen: int, number: int, reason: str) -> None:
        """``NAK number reason``: that record was refused; it is never sent again on its own
        account, and counted when the ``ACK`` that follows settles it (or the sender stops)."""
        with self.cond:
            if gen != self._gen:
                return
            for n, entry in self._unacked:
                if n == number:
                    if entry.refused is None:
                        entry.refused = reason
                    break
                if n > number:
                    break
            self.cond.notify_all()

    def _count_refused(self, entry: Entry) -> None:
        """A record whose last send was refused: a ``nak`` by its reason — or ``unconfirmed`` if
        an earlier send's connection broke unsettled (that send may have been stored)."""
        if entry.resent:
            self._unconfirmed += 1
        else:
            self._nak[entry.refused] = self._nak.get(entry.refused, 0) + 1

    def _settle(self, entry: Entry) -> None:
        self._bytes -= len(entry.data)
        self._unacked_bytes -= len(entry.data)
        self._progress += 1

    # flush() and close(). ---------------------------------------------------------------------

    def wait_drained(self, timeout: float) -> bool:
        """Wait until nothing is queued or unsettled; False if ``timeout`` passed first."""
        deadline = self._clock() + timeout
        with self.cond:
            self._flushers += 1
            try:
                if self._lingering:
                    self.cond.notify_all()  # the sender writes now
                while self._pending or self._unacked:
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        return False
                    self.cond.wait(remaining)
                return True
            finally:
                self._flushers -= 1

    @property
    def progress(self) -> int:
        return self._progress

    def close(self) -> None:
        """Refuse new records from now on (each counted ``closed``)."""
        with self.cond:
            self._closed = True

    def stop(self) -> None:
        """Stop the sender; what is left is counted: queued as dropped ``closed``, sent and not
        settled as ``unconfirmed`` (it may have been stored)."""
        with self.cond:
            self._stopping = True
            for entry in self._pending:
                if not entry.report:
                    self._drop(CLOSED, entry.levelno)
            for _, entry in self._unacked:
                if entry.report:
                    continue
                if entry.refused is None:
                    self._unconfirmed += 1
                else:
                    self._count_refused(entry)
            self._pending.clear()
            self._unacked.clear()
            self._bytes = self._unacked_bytes = 0
            self.cond.notify_all()

    # Visibility. ------------------------------------------------------------------------------

    def _notice_due(self) -> bool:
        return self._unnoticed > 0 and self._clock() >= self._notice_at

    def notice_due_in(self) -> Optional[float]:
        """Seconds until a pending stderr notice may be written; None if there is none."""
        with self.cond:
            if not self._unnoticed:
                return None
            return max(0.0, self._notice_at - self._clock())

    def take_notice(self, socket_path: str) -> Optional[str]:
        """The stderr line about drops, if one is due (at most one per minute)."""
        with self.cond:
            if not self._notice_due():
                return None
            count, self._unnoticed = self._unnoticed, 0
            self._notice_at = self._clock() + NOTICE_INTERVAL_SECONDS
            by_reason: Dict[str, int] = {}
            for (reason, _), n in self._dropped.items():
                by_reason[reason] = by_reason.get(reason, 0) + n
            state = "connected" if self.connected else f"not connected ({self.last_error or 'not tried yet'})"
            reasons = ", ".join(f"{reason}={n}" for reason, n in sorted(by_reason.items()))
            return (
                f"sluice_logging: dropped {count} log record(s) since the last notice "
                f"(total by reason: {reasons}); agent {socket_path}: {state}\n"
            )

    def stats(self) -> Dict[str, object]:
        with self.cond:
            dropped: Dict[str, Dict[str, int]] = {}
            for (reason, level), count in self._dropped.items():
                dropped.setdefault(reason, {})[level] = count
            return {
                "queued": len(self._pending),
                "queued_bytes": self._bytes - self._unacked_bytes,
                "unacknowledged": len(self._unacked),
                "unacknowledged_bytes": self._unacked_bytes,
                "sent": self._sent,
                "acknowledged": self._acknowledged,
                "dropped": dropped,
                "dropped_total": sum(self._dropped.values()),
                "nak": dict(self._nak),
                "replaced": self._replaced,
                "truncated": self._truncated,
                "reconnects": self._reconnects,
                "unconfirmed": self._unconfirmed,
                "reports_sent": self._reports_sent,
                "connected": self.connected,
                "ack_point": self.ack_point,
                "last_error": self.last_error,
            }
