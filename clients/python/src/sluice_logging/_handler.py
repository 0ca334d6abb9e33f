"""``SluiceHandler``: the ``logging.Handler`` applications configure.

Owns: the handler's options and their defaults, the sender's lifecycle (started lazily by the
first record, restarted lazily in a forked child, stopped by ``close()``), and ``flush`` and
``close`` with bounded waits.

Must not: wait in ``emit`` — it formats the record (``_format``) and offers it to a bounded queue
(``_queue``), which drops rather than blocks; no socket call, no connect, no stderr write
happens on the application's thread (those are the sender's, ``_sender``). Nor may ``close()``
or ``flush()`` wait longer than their timeouts, so interpreter exit never hangs.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import os
import threading
import weakref
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ._format import RecordFormatter
from ._queue import FORMAT_ERROR, RecordQueue
from ._sender import Sender

#: Where the agent listens in the pod (``helm/sluice``: a shared ``emptyDir`` at /run/sluice),
#: unless the environment says otherwise: the chart and ``sluice inject`` set ``SLUICE_SOCKET``
#: in the app's container.
DEFAULT_SOCKET_PATH = "/run/sluice/sluice.sock"
SOCKET_ENV = "SLUICE_SOCKET"
DEFAULT_MAX_QUEUE_RECORDS = 8192
DEFAULT_MAX_QUEUE_BYTES = 8 * 1024 * 1024
#: The agent's default ``max_record_size`` (``ingest.listeners.<name>.max_record_size``).
DEFAULT_MAX_RECORD_SIZE = 1024 * 1024
DEFAULT_DROP_BELOW_WARNING_AT = 0.8
DEFAULT_FLUSH_TIMEOUT = 2.0
DEFAULT_CLOSE_TIMEOUT = 2.0
#: How long ``close()`` waits for the sender thread after telling it to stop.
SENDER_JOIN_SECONDS = 0.3

ContextVarsOption = Union[
    Iterable[Union[contextvars.ContextVar[Any], str]],
    Mapping[str, Union[contextvars.ContextVar[Any], str]],
    None,
]

# Every live handler, so that one fork hook (registered once) can reset them all in a child.
_HANDLERS: "weakref.WeakSet[SluiceHandler]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for handler in list(_HANDLERS):
        handler._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _resolve(var: Union[contextvars.ContextVar[Any], str]) -> contextvars.ContextVar[Any]:
    """A ``ContextVar``, or the dotted path of one (``"ext://myapp.context.request_id"``, as
    ``dictConfig`` writes it)."""
    if isinstance(var, contextvars.ContextVar):
        return var
    path = str(var)
    if path.startswith("ext://"):
        path = path[len("ext://") :]
    module_name, _, attribute = path.rpartition(".")
    resolved = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(resolved, contextvars.ContextVar):
        raise TypeError(f"{var!r} is not a contextvars.ContextVar")
    return resolved


class SluiceHandler(logging.Handler):
    """Ships log records to the Sluice agent over its Unix socket, one JSON line each.

    The logging call never waits: ``emit`` renders the record to JSON (with its stack trace,
    ``extra`` fields, registered context variables and OpenTelemetry ids) and puts it on a
    bounded queue; a daemon thread writes the queue to the socket. When the queue is full the
    incoming record is dropped and counted (``stats()``), never the caller blocked.

    Args:
        socket_path: The agent's ``lines`` listener; by default ``$SLUICE_SOCKET``, else
            ``/run/sluice/sluice.sock``.
        level: As for every handler.
        max_queue_records: Records held at most: queued, and in acknowledged mode sent and not
            yet acknowledged.
        max_queue_bytes: Bytes held at most, counted the same way.
        acknowledged: Use the protocol's acknowledged mode (a ``SLUICE/2`` client session):
            records count as held until the agent's ``ACK``, and are sent again after a
            reconnect as the same records (one row each).
        max_record_size: The listener's ``max_record_size``; longer records are cut to it.
        drop_below_warning_at: Above this fraction of either bound, records below WARNING are
            dropped, keeping the rest of the room for warnings and errors. ``None``: no such
            tier.
        flush_timeout: ``flush()``'s default wait, in seconds.
        close_timeout: How long ``close()`` waits for the queue to drain, in seconds.
        context_vars: ``ContextVar``\\ s whose values go into every record (a mapping names the
            fields; otherwise a variable's ``name`` is its field).
    """

    #: ``close()`` drains; Python 3.12+'s ``logging.shutdown`` then skips ``flush()``.
    flushOnClose = False

    def __init__(
        self,
        socket_path: Optional[str] = None,
        level: Union[int, str] = logging.NOTSET,
        *,
        max_queue_records: int = DEFAULT_MAX_QUEUE_RECORDS,
        max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
        acknowledged: bool = False,
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
        drop_below_warning_at: Optional[float] = DEFAULT_DROP_BELOW_WARNING_AT,
        flush_timeout: float = DEFAULT_FLUSH_TIMEOUT,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        context_vars: ContextVarsOption = None,
    ) -> None:
        super().__init__(level)
        if max_queue_records < 1 or max_queue_bytes < 1:
            raise ValueError("max_queue_records and max_queue_bytes must be positive")
        if not 256 <= max_record_size <= 64 * 1024 * 1024:
            raise ValueError("max_record_size must be between 256 B and 64 MiB")
        if drop_below_warning_at is not None and not 0.0 < drop_below_warning_at <= 1.0:
            raise ValueError("drop_below_warning_at must be in (0, 1], or None")
        if socket_path is None:
            socket_path = os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET_PATH
        self.socket_path = os.fspath(socket_path)
        self.acknowledged = bool(acknowledged)
        self.flush_timeout = float(flush_timeout)
        self.close_timeout = float(close_timeout)
        self._queue = RecordQueue(int(max_queue_records), int(max_queue_bytes), drop_below_warning_at)
        self._formatter = RecordFormatter(int(max_record_size), self._named_vars(context_vars))
        self._sender: Optional[Sender] = None
        self._pid = os.getpid()
        self._closed = False
        self._close_lock = threading.Lock()
        # The queue's progress when a flush last gave up: close() then does not wait again for
        # an agent that has taken nothing since (Python before 3.12 flushes, then closes).
        self._stalled_at: Optional[int] = None
        _HANDLERS.add(self)

    @staticmethod
    def _named_vars(context_vars: ContextVarsOption) -> List[Tuple[str, contextvars.ContextVar[Any]]]:
        if context_vars is None:
            return []
        if isinstance(context_vars, Mapping):
            return [(str(name), _resolve(var)) for name, var in context_vars.items()]
        named = []
        for var in context_vars:
            resolved = _resolve(var)
            named.append((resolved.name, resolved))
        return named

    def add_context_var(self, var: contextvars.ContextVar[Any], name: Optional[str] = None) -> None:
        """Put ``var``'s value, when it has one, into every record as field ``name`` (default:
        the variable's name)."""
        # Copy on write: emit iterates the list without a lock of ours.
        self._formatter.context_vars = [*self._formatter.context_vars, (name or var.name, var)]

    # logging.Handler -------------------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        """Format and enqueue; never blocks on the agent, never raises."""
        try:
            formatted = self._formatter.format(record)
        except Exception:
            self._queue.drop(FORMAT_ERROR, record.levelno)
            return
        if self._sender is None and not self._closed:
            self._start_sender()
        self._queue.offer(
            formatted.data, record.levelno, formatted.replaced, formatted.truncated, int(record.created * 1_000_000)
        )

    def flush(self, timeout: Optional[float] = None) -> bool:  # type: ignore[override]
        """Wait until every record is written (acknowledged mode: acknowledged), at most
        ``timeout`` seconds (default ``flush_timeout``). True if everything went."""
        drained = self._queue.wait_drained(self.flush_timeout if timeout is None else timeout)
        self._stalled_at = None if drained else self._queue.progress
        return drained

    def close(self, timeout: Optional[float] = None) -> None:
        """Drain for at most ``timeout`` seconds (default ``close_timeout``), then stop the
        sender. What is still queued is counted dropped (``closed``); what was sent and not
        acknowledged, ``unconfirmed``. Records logged afterwards are dropped (``closed``)."""
        with self._close_lock:
            if not self._closed:
                self._closed = True
                wait = self.close_timeout if timeout is None else timeout
                if self._stalled_at is not None and self._stalled_at == self._queue.progress:
                    wait = 0.0  # a flush just waited in vain; nothing moved since
                self._queue.close()
                if self._sender is not None:
                    self._queue.wait_drained(wait)
                self._queue.stop()
                if self._sender is not None:
                    self._sender.join(SENDER_JOIN_SECONDS)
        super().close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.socket_path} ({logging.getLevelName(self.level)})>"

    # Visibility ------------------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """Counters since the handler was made (in a forked child: since the fork).

        ``queued``/``queued_bytes``: waiting to be sent; ``unacknowledged``/
        ``unacknowledged_bytes``: sent, awaiting ``ACK`` (acknowledged mode); ``sent``: written
        to the socket; ``acknowledged``: ``ACK``\\ ed; ``dropped``: ``{reason: {level: n}}``
        (reasons ``full``, ``high_water``, ``closed``, ``format_error``) and ``dropped_total``;
        ``nak``: ``{reason: n}`` as the agent said; ``replaced``: records in which characters
        were replaced by U+FFFD; ``truncated``: records cut to ``max_record_size``;
        ``reconnects``; ``unconfirmed``: sent, never acknowledged, when ``close()`` gave up;
        ``reports_sent``: in-band drop reports; ``connected``, ``ack_point``, ``last_error``.
        """
        return self._queue.stats()

    # Lifecycle -------------------------------------------------------------------------------

    def _start_sender(self) -> None:
        if self._pid != os.getpid():  # forked without the hook (should not happen)
            self._after_fork_in_child()
        sender = Sender(self._queue, self.socket_path, self.acknowledged)
        try:
            sender.start()
        except RuntimeError:  # the interpreter is shutting down: records stay queued
            return
        self._sender = sender

    def _after_fork_in_child(self) -> None:
        """The parent's sender thread does not exist here and its queue is the parent's to
        send: start from an empty queue; the first record starts a new sender."""
        if self._sender is not None:
            self._sender.abandon_after_fork()
            self._sender = None
        self._queue.reset_after_fork()
        if self._closed:
            self._queue.close()
        self._close_lock = threading.Lock()
        self._pid = os.getpid()
