"""A small in-process stand-in for the Sluice agent's ``lines`` listener (docs/PROTOCOL.md).

It accepts connections on a Unix socket, collects the records, checks each as the agent does
(size, UTF-8, NUL and its JSON escape, lone surrogates, depth) and, for connections that start
with ``SLUICE/1 ACK`` or a client session's ``SLUICE/2 ACK session=… first=…`` (each line then
``<unix microseconds> <record>``), answers ``OK spooled`` then ``NAK n reason`` / ``ACK n`` (a
session's own numbers), keeping each session record as ``(session, n, time_us, record)``. It can be stopped
and started again on the same path, told to stop reading (``stall``), or to hold its ACKs.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from typing import Callable, List, Optional, Tuple

MAX_RECORD_SIZE = 1024 * 1024
MAX_JSON_DEPTH = 64

_ESCAPE = re.compile(rb"\\(u[0-9a-fA-F]{4}|.)")
_SESSION = re.compile(rb"SLUICE/2 ACK session=([0-9a-f]{32}) first=([1-9][0-9]*)")
_STAMPED = re.compile(rb"([0-9]{1,19}) (.*)", re.DOTALL)


def agent_check(line: bytes, max_record_size: int = MAX_RECORD_SIZE) -> Optional[str]:
    """The agent's reason to refuse ``line`` (without its newline), or None."""
    if len(line) > max_record_size:
        return "too_large"
    if not line:
        return "empty"
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    if b"\x00" in line:
        return "contains_nul"
    if line.startswith(b"{"):
        depth = deepest = 0
        in_string = escaped = False
        for byte in line:
            if in_string:
                if escaped:
                    escaped = False
                elif byte == 0x5C:
                    escaped = True
                elif byte == 0x22:
                    in_string = False
            elif byte == 0x22:
                in_string = True
            elif byte in b"{[":
                depth += 1
                deepest = max(deepest, depth)
            elif byte in b"}]":
                depth -= 1
        if deepest > MAX_JSON_DEPTH:
            return "too_deep"
        units = [m.group(1) for m in _ESCAPE.finditer(line)]
        i = 0
        while i < len(units):
            unit = units[i]
            if unit.startswith(b"u"):
                value = int(unit[1:], 16)
                if value == 0:
                    return "contains_nul"
                if 0xD800 <= value <= 0xDBFF:
                    nxt = units[i + 1] if i + 1 < len(units) else b""
                    if not (nxt.startswith(b"u") and 0xDC00 <= int(nxt[1:], 16) <= 0xDFFF):
                        return "unpaired_surrogate"
                    i += 1
                elif 0xDC00 <= value <= 0xDFFF:
                    return "unpaired_surrogate"
            i += 1
    return None


class FakeAgent:
    """See the module docstring. ``nak`` decides extra refusals: ``nak(n, line) -> reason``."""

    def __init__(
        self,
        path: str,
        *,
        ack_point: str = "spooled",
        nak: Optional[Callable[[int, bytes], Optional[str]]] = None,
        max_record_size: int = MAX_RECORD_SIZE,
    ) -> None:
        self.path = path
        self.ack_point = ack_point
        self.nak = nak
        self.max_record_size = max_record_size
        self.lines: List[bytes] = []  # every record line received, in order of arrival
        self.rejected: List[Tuple[str, bytes]] = []
        self.connections = 0
        self.acknowledged_connections = 0
        # Client sessions: (session, first) per handshake, and (session, n, time_us, record) per line.
        self.sessions: List[Tuple[str, int]] = []
        self.numbered: List[Tuple[str, int, int, bytes]] = []
        self.hold_acks = False
        self._cond = threading.Condition()
        self._reading = threading.Event()
        self._reading.set()
        self._listener: Optional[socket.socket] = None
        self._conns: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self._running = False

    # Lifecycle.

    def start(self) -> "FakeAgent":
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(64)
        listener.settimeout(0.05)
        self._listener = listener
        self._running = True
        thread = threading.Thread(target=self._accept, daemon=True, name="fake-agent-accept")
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Close the listener and every connection and remove the socket file."""
        self._running = False
        self._reading.set()
        # The connections end first, so that no thread takes in a line after stop() returns.
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(10)
        self._threads.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def restart(self) -> None:
        self.stop()
        self.start()

    def stall(self) -> None:
        """Stop reading every connection (the client's writes fill the socket and block)."""
        self._reading.clear()

    def resume(self) -> None:
        self._reading.set()

    # What arrived.

    def records(self) -> List[dict]:
        with self._cond:
            return [json.loads(line) for line in self.lines]

    def messages(self) -> List[str]:
        return [r.get("message", "") for r in self.records() if "sluice.client" not in r]

    def wait_for(self, predicate: Callable[["FakeAgent"], bool], timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))
            return True

    def wait_for_lines(self, count: int, timeout: float = 5.0) -> bool:
        return self.wait_for(lambda agent: len(agent.lines) >= count, timeout)

    def expect(self, count: int, timeout: float = 5.0) -> List[dict]:
        """The records, once ``count`` have arrived (a plain-mode flush only means written)."""
        assert self.wait_for_lines(count, timeout), f"{len(self.lines)} of {count} records arrived"
        assert self.rejected == [], f"the agent would refuse: {self.rejected[:3]}"
        return self.records()

    # Serving.

    def _accept(self) -> None:
        while self._running:
            try:
                conn, _ = self._listener.accept()  # type: ignore[union-attr]
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(0.05)
            with self._cond:
                self.connections += 1
            self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True, name="fake-agent-conn")
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        first = True
        acknowledged = False
        session_id: Optional[str] = None
        number = 0
        replies: List[bytes] = []
        pending_ack = 0
        while self._running:
            if not self._reading.is_set():
                self._reading.wait(0.05)
                continue
            if acknowledged and not self.hold_acks and pending_ack:
                replies.append(b"ACK %d\n" % pending_ack)
                pending_ack = 0
            if replies:
                try:
                    conn.sendall(b"".join(replies))
                except OSError:
                    return
                replies.clear()
            try:
                chunk = conn.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.endswith(b"\r"):
                    line = line[:-1]
                if first:
                    first = False
                    session = _SESSION.fullmatch(line)
                    if line == b"SLUICE/1 ACK" or session is not None:
                        acknowledged = True
                        if session is not None:
                            session_id = session.group(1).decode()
                            number = int(session.group(2)) - 1
                        with self._cond:
                            self.acknowledged_connections += 1
                            if session is not None:
                                self.sessions.append((session_id, number + 1))
                        replies.append(b"OK %s\n" % self.ack_point.encode())
                        continue
                number += 1
                time_us = None
                if session_id is not None:
                    stamped = _STAMPED.fullmatch(line)
                    if stamped is None:
                        reason: Optional[str] = "malformed"
                        with self._cond:
                            self.rejected.append(("malformed", line))
                            self._cond.notify_all()
                        replies.append(b"NAK %d malformed\n" % number)
                        pending_ack = number
                        continue
                    time_us, line = int(stamped.group(1)), stamped.group(2)
                    with self._cond:
                        self.numbered.append((session_id, number, time_us, line))
                reason = agent_check(line, self.max_record_size)
                if reason is None and self.nak is not None:
                    reason = self.nak(number, line)
                with self._cond:
                    if reason is None:
                        self.lines.append(line)
                    else:
                        self.rejected.append((reason, line))
                    self._cond.notify_all()
                if acknowledged:
                    if reason is not None:
                        replies.append(b"NAK %d %s\n" % (number, reason.encode()))
                    pending_ack = number
