"""The sender lets a burst gather before it writes, and what ends that wait early."""

from __future__ import annotations

import logging
import threading
import time

from sluice_logging import _queue


def _lingering(queue: _queue.RecordQueue, records: int, size: int) -> threading.Thread:
    """The sender's linger, started with a minute to wait."""
    sender = threading.Thread(target=queue.linger, args=(60.0, records, size), daemon=True)
    sender.start()
    deadline = time.monotonic() + 5
    while not queue._lingering and time.monotonic() < deadline:  # noqa: SLF001 (the state under test)
        time.sleep(0.001)
    return sender


def _offer(queue: _queue.RecordQueue, data: bytes = b"{}\n") -> None:
    queue.offer(data, logging.INFO, False, False)


def test_the_linger_ends_when_the_record_that_reaches_half_a_batch_is_offered():
    queue = _queue.RecordQueue(1000, 1 << 20, None)
    _offer(queue)
    sender = _lingering(queue, 3, 1 << 20)
    _offer(queue)
    sender.join(0.05)
    assert sender.is_alive(), "a record below the mark notifies nobody"
    _offer(queue)
    sender.join(10)
    assert not sender.is_alive()


def test_the_linger_ends_when_the_bytes_reach_their_mark():
    queue = _queue.RecordQueue(1000, 1 << 20, None)
    _offer(queue)
    sender = _lingering(queue, 1000, 100)
    _offer(queue, b"x" * 100 + b"\n")
    sender.join(10)
    assert not sender.is_alive()


def test_a_flush_ends_the_linger_and_none_starts_while_it_waits():
    queue = _queue.RecordQueue(1000, 1 << 20, None)
    _offer(queue)
    sender = _lingering(queue, 1000, 1 << 20)
    flush = threading.Thread(target=queue.wait_drained, args=(30.0,), daemon=True)
    flush.start()
    sender.join(10)
    assert not sender.is_alive()
    again = threading.Thread(target=queue.linger, args=(60.0, 1000, 1 << 20), daemon=True)
    again.start()
    again.join(10)
    assert not again.is_alive(), "no linger while a flush waits"
    queue.stop()
    flush.join(10)


def test_the_linger_ends_at_stop():
    queue = _queue.RecordQueue(1000, 1 << 20, None)
    _offer(queue)
    sender = _lingering(queue, 1000, 1 << 20)
    queue.stop()
    sender.join(10)
    assert not sender.is_alive()
