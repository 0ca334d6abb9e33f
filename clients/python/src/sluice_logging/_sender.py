"""The sender thread: the only code that touches the agent's socket.

Owns: connecting (lazily, when there is a record to send, and again after every failure with
jittered exponential backoff, forever), the acknowledged-mode handshake, writing queued lines in
batches, and in acknowledged mode a second thread per connection that reads ``ACK``/``NAK`` lines
and settles records in the queue. After a lost connection, what it had not settled is sent again,
in order, on the next one.

Must not: drop or reorder records (that is the queue's policy, applied at the caller's side), hold
the queue's lock while doing I/O, or keep the interpreter alive (daemon threads, and every socket
wait is short so that ``stop()`` is noticed).
"""

from __future__ import annotations

import errno
import random
import socket
import sys
import threading
import time
from typing import Optional, Tuple

from ._queue import RecordQueue

#: Backoff between connection attempts: from the first to the largest delay, doubling, each
#: drawn uniformly from its upper half.
BACKOFF_FIRST_SECONDS = 0.02
BACKOFF_MAX_SECONDS = 2.0
#: ``connect()`` waits this long at most (a full listen backlog blocks it).
CONNECT_TIMEOUT_SECONDS = 1.0
#: The agent's ``OK <ack point>`` answer to the handshake must come within this.
HANDSHAKE_TIMEOUT_SECONDS = 5.0
#: The longest single wait in ``send``/``recv``: how soon a stop or a due stderr notice is seen
#: while the agent is not reading.
IO_TICK_SECONDS = 0.25
#: One write takes at most this many records or bytes (at least one record).
BATCH_RECORDS = 1024
BATCH_BYTES = 256 * 1024
#: How long the sender lets a burst gather before it writes, unless half a batch waits already
#: (``RecordQueue.linger``): a record reaches the agent at most this much later.
LINGER_SECONDS = 0.002
#: The sender's longest idle wait (it is woken for records; this is a safety net).
IDLE_SECONDS = 5.0

#: Acknowledged mode opens a client session (docs/PROTOCOL.md, "Client sessions"): the agent
#: answers with the client's own numbers, and a record sent again is the same record.
HANDSHAKE = "SLUICE/2 ACK session={session} first={first}\n"


def describe(error: BaseException) -> str:
    """A short text for an error: ``ENOENT``, ``ECONNREFUSED``…, or the exception's words."""
    if isinstance(error, OSError) and error.errno is not None:
        return errno.errorcode.get(error.errno, str(error.errno))
    return f"{type(error).__name__}: {error}"


class Backoff:
    """Jittered exponential backoff."""

    def __init__(self, first: float = BACKOFF_FIRST_SECONDS, largest: float = BACKOFF_MAX_SECONDS) -> None:
        self._first = first
        self._largest = largest
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self._largest)
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self._next = self._first


class Connection:
    """One connection to the agent; ``gen`` is the queue's name for it."""

    def __init__(self, sock: socket.socket, gen: int) -> None:
        self.sock = sock
        self.gen = gen
        self.broken = False
        self.opened = time.monotonic()

    def shut(self) -> None:
        """Mark it broken and wake whichever thread waits on it."""
        self.broken = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Sender:
    """Started once per process by the handler (again in a forked child)."""

    def __init__(self, queue: RecordQueue, socket_path: str, acknowledged: bool) -> None:
        self._queue = queue
        self._path = socket_path
        self._acknowledged = acknowledged
        self._conn: Optional[Connection] = None
        # How long the last connection lost had lived (seconds; None once the next connect
        # decided its backoff on it). Written by whichever thread lost it.
        self._lost_after: Optional[float] = None
        self._connected_before = False
        self._thread = threading.Thread(target=self._run, name="sluice-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        """After ``queue.stop()``: shut the connection (ending a write the agent is not reading)
        and wait up to ``timeout`` for the thread."""
        conn = self._conn
        if conn is not None:
            conn.shut()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def abandon_after_fork(self) -> None:
        """In a forked child: close this process's copy of the socket without shutting the
        connection down (the parent still uses it); the thread does not exist here."""
        conn = self._conn
        if conn is not None:
            try:
                conn.sock.close()
            except OSError:
                pass

    # The sender thread. -----------------------------------------------------------------------

    def _run(self) -> None:
        queue = self._queue
        backoff = Backoff()
        try:
            while not queue.stopping:
                try:
                    self._step(backoff)
                except Exception as error:  # a bug here must not end shipping for good
                    queue.connect_failed(f"internal error: {describe(error)}")
                    if self._conn is not None:
                        self._lose(self._conn, None)
                    queue.sleep(backoff.next())
        finally:
            if self._conn is not None:
                self._conn.shut()
                self._conn.sock.close()

    def _step(self, backoff: Backoff) -> None:
        """Wait for records; connect if need be; write one batch."""
        queue = self._queue
        due = queue.notice_due_in()
        queue.wait_for_work(IDLE_SECONDS if due is None else min(due, IDLE_SECONDS))
        self._write_notice()
        if queue.stopping or not queue.has_pending():
            return
        queue.linger(LINGER_SECONDS, BATCH_RECORDS // 2, BATCH_BYTES // 2)
        if queue.stopping:
            return
        conn = self._conn
        if conn is None or conn.broken:
            if conn is not None:
                self._lose(conn, None)
            lived, self._lost_after = self._lost_after, None
            if lived is not None:
                if lived < BACKOFF_MAX_SECONDS:
                    # The last connection ended soon after it opened — an agent that accepts and
                    # closes at once (over its max_connections, a peer it does not allow) — so
                    # back off as for a failed connect instead of connecting again at once.
                    queue.sleep(backoff.next())
                    return
                backoff.reset()
            conn = self._connect()
            if conn is None:
                queue.sleep(backoff.next())
                return
        if self._acknowledged:
            self._send_numbered(conn)
        else:
            self._send_plain(conn)

    def _connect(self) -> Optional[Connection]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_SECONDS)
            sock.connect(self._path)
            ack_point, leftover = self._handshake(sock) if self._acknowledged else (None, b"")
            sock.settimeout(IO_TICK_SECONDS)
        except (OSError, ValueError) as error:
            sock.close()
            self._queue.connect_failed(describe(error))
            return None
        gen = self._queue.connection_opened(ack_point, reconnect=self._connected_before)
        self._connected_before = True
        conn = Connection(sock, gen)
        self._conn = conn
        if self._acknowledged:
            reader = threading.Thread(
                target=self._read_acks, args=(conn, leftover), name="sluice-acks", daemon=True
            )
            reader.start()
        return conn

    def _handshake(self, sock: socket.socket) -> Tuple[str, bytes]:
        """Open the session from the first record not acknowledged; return the agent's ack point
        and any bytes after its answer."""
        sock.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        first = self._queue.first_unsettled()
        sock.sendall(HANDSHAKE.format(session=self._queue.session, first=first).encode())
        buffered = b""
        while b"\n" not in buffered:
            chunk = sock.recv(4096)
            if not chunk:
                raise ValueError("the agent closed the connection during the handshake")
            buffered += chunk
            if len(buffered) > 4096:
                break
        line, _, rest = buffered.partition(b"\n")
        words = line.decode("utf-8", "replace").split()
        if len(words) != 2 or words[0] != "OK":
            raise ValueError(f"the agent answered {line[:80]!r} to SLUICE/2 ACK")
        return words[1], rest

    def _send_plain(self, conn: Connection) -> None:
        batch = self._queue.peek(BATCH_RECORDS, BATCH_BYTES)
        if not batch:
            return
        written, error = self._write(conn, b"".join(entry.data for entry in batch))
        whole = 0
        end = 0
        for entry in batch:
            end += len(entry.data)
            if end > written:
                break
            whole += 1
        # A record cut by a failed write stays queued and goes again whole on the next
        # connection; only the agent's end can have seen its first part.
        self._queue.commit(batch[:whole])
        if error is not None:
            self._lose(conn, error)

    def _send_numbered(self, conn: Connection) -> None:
        batch = self._queue.take_numbered(conn.gen, BATCH_RECORDS, BATCH_BYTES)
        if not batch:
            return
        # Each line: the time it was logged, then the record (the same on every send).
        data = b"".join(b"%d %s" % (entry.time_us, entry.data) for entry in batch)
        _, error = self._write(conn, data)
        if error is not None:
            self._lose(conn, error)

    def _write(self, conn: Connection, data: bytes) -> Tuple[int, Optional[str]]:
        """Write ``data``; returns how many bytes went, and why it stopped short if it did."""
        view = memoryview(data)
        done = 0
        while done < len(view):
            if self._queue.stopping:
                return done, "stopped"
            if conn.broken:
                return done, None
            try:
                done += conn.sock.send(view[done:])
            except socket.timeout:
                self._write_notice()  # the agent is not reading: drops may be piling up
            except OSError as error:
                return done, describe(error)
        return done, None

    def _lose(self, conn: Connection, error: Optional[str]) -> None:
        conn.shut()
        try:
            conn.sock.close()
        except OSError:
            pass
        self._queue.connection_lost(conn.gen, error)
        if self._conn is conn:
            self._conn = None
            self._lost_after = time.monotonic() - conn.opened

    def _write_notice(self) -> None:
        line = self._queue.take_notice(self._path)
        if line is None:
            return
        stream = sys.stderr
        if stream is None:
            return
        try:
            stream.write(line)
            stream.flush()
        except Exception:  # a closed or broken stderr: the counters still say it
            pass

    # The ACK reader thread (acknowledged mode, one per connection). ---------------------------

    def _read_acks(self, conn: Connection, buffered: bytes) -> None:
        queue = self._queue
        error: Optional[str] = None
        buffer = buffered
        while not conn.broken and not queue.stopping:
            if b"\n" not in buffer:
                try:
                    chunk = conn.sock.recv(65536)
                except socket.timeout:
                    continue
                except OSError as failure:
                    error = describe(failure)
                    break
                if not chunk:
                    error = "the agent closed the connection"
                    break
                buffer += chunk
                if b"\n" not in buffer:
                    if len(buffer) > 4096:
                        error = "an unreadable answer from the agent"
                        break
                    continue
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                words = line.split()
                try:
                    if len(words) == 2 and words[0] == b"ACK":
                        queue.ack(conn.gen, int(words[1]))
                    elif len(words) >= 3 and words[0] == b"NAK":
                        queue.nak(conn.gen, int(words[1]), words[2].decode("ascii", "replace"))
                except ValueError:
                    pass  # a line this version does not know: ignore it
        conn.broken = True
        queue.connection_lost(conn.gen, error)
