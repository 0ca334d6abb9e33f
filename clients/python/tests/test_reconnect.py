"""Reconnecting, and acknowledged mode: resend what was not acknowledged, count NAKs."""

from __future__ import annotations

import os
import socket
import threading
import time

from sluice_logging._sender import Backoff
from waiting import wait_until


def test_the_sender_connects_when_the_agent_appears_later(agents, handlers, logger_for):
    handler = handlers()
    log = logger_for(handler)
    log.info("before the agent")
    assert wait_until(lambda: handler.stats()["last_error"] == "ENOENT")

    agent = agents().start()
    assert [r["message"] for r in agent.expect(1)] == ["before the agent"]
    assert handler.stats()["reconnects"] == 0


def test_a_stale_socket_file_is_retried_like_a_missing_one(socket_path, agents, handlers, logger_for):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(socket_path)  # bound, never listening: connect() gets ECONNREFUSED
    handler = handlers()
    logger_for(handler).info("waits for the agent")
    assert wait_until(lambda: handler.stats()["last_error"] == "ECONNREFUSED")
    stale.close()
    os.unlink(socket_path)
    agent = agents().start()
    assert agent.expect(1)[0]["message"] == "waits for the agent"


def test_the_sender_reconnects_after_the_agent_restarts(agent, handlers, logger_for):
    handler = handlers()
    log = logger_for(handler)
    log.info("first")
    assert agent.expect(1)

    agent.stop()
    for i in range(5):
        log.info("during the restart %d", i)  # queued; the first write after the stop fails
    time.sleep(0.1)
    agent.start()

    messages = [r["message"] for r in agent.expect(6)]
    assert messages == ["first"] + [f"during the restart {i}" for i in range(5)]
    assert handler.stats()["reconnects"] >= 1


def test_backoff_grows_with_jitter_up_to_its_cap_and_resets():
    backoff = Backoff(first=0.02, largest=2.0)
    delays = [backoff.next() for _ in range(12)]
    assert 0.01 <= delays[0] <= 0.02
    assert all(delay <= 2.0 for delay in delays)
    assert delays[-1] >= 1.0
    backoff.reset()
    assert backoff.next() <= 0.02


def three_unacknowledged_then_the_agent_restarts(agents, handlers, logger_for, before_restart=None):
    """An acknowledged handler logs three records the agent never acknowledges; the agent
    restarts (the connection is lost) and acknowledges from then on. Returns (agent, handler, log)."""
    agent = agents()
    agent.hold_acks = True
    agent.start()
    handler = handlers(acknowledged=True)
    log = logger_for(handler)
    for i in range(3):
        log.info("unacknowledged %d", i)
    assert agent.wait_for_lines(3)
    if before_restart is not None:
        before_restart(handler)
    agent.stop()  # the ACKs never come: the connection is lost
    agent.hold_acks = False
    agent.start()
    log.info("after the restart")
    return agent, handler, log


def test_ack_mode_resends_unacknowledged_records_after_a_reconnect(agents, handlers, logger_for):
    def still_held(handler):
        assert handler.stats()["unacknowledged"] == 3
        assert handler.flush(0.2) is False, "flush waits for the ACKs in acknowledged mode"

    agent, handler, _ = three_unacknowledged_then_the_agent_restarts(agents, handlers, logger_for, still_held)

    assert handler.flush(5)
    messages = [r["message"] for r in agent.records()]
    assert messages == [f"unacknowledged {i}" for i in range(3)] * 2 + ["after the restart"]
    stats = handler.stats()
    assert stats["acknowledged"] == 4 and stats["unacknowledged"] == 0
    assert stats["sent"] == 7, "three of them twice"
    assert stats["ack_point"] == "spooled" and stats["reconnects"] == 1


def test_a_resend_after_a_reconnect_is_the_same_session_number_and_time_so_the_agent_stores_it_once(
    agents, handlers, logger_for
):
    agent, handler, _ = three_unacknowledged_then_the_agent_restarts(agents, handlers, logger_for)
    assert handler.flush(5)

    (session, first), (again, resumed) = agent.sessions
    assert (again, first, resumed) == (session, 1, 1), "the same session, from the first unacknowledged"
    by_number = {}
    for sent_session, n, time_us, record in agent.numbered:
        assert sent_session == session
        by_number.setdefault(n, set()).add((time_us, record))
    assert sorted(by_number) == [1, 2, 3, 4]
    assert all(len(sends) == 1 for sends in by_number.values()), "every send of a record is identical"


def refused_then_the_connection_lost(agents, handlers, logger_for, refuse_again: bool):
    """Three records on one connection, the second refused (NAK heard by the client) and the
    covering ACK never sent; then the agent restarts — refusing it again or not — and the client
    sends all three again under the same numbers. Returns the agent and the handler, flushed."""
    agent = agents(nak=lambda n, line: "rate_limited" if b"refuse me" in line else None)
    agent.hold_acks = True
    agent.start()
    handler = handlers(acknowledged=True)
    log = logger_for(handler)
    log.info("keep 1")
    log.info("refuse me")
    log.info("keep 2")
    assert agent.wait_for_lines(2)
    assert wait_until(lambda: any(entry.refused for _, entry in list(handler._queue._unacked)), timeout=5)
    agent.stop()
    agent.hold_acks = False
    if not refuse_again:
        agent.nak = None
    agent.start()
    assert handler.flush(5)
    return agent, handler


def test_a_refused_record_keeps_its_place_until_acknowledged_so_resent_numbers_stay_consecutive(
    agents, handlers, logger_for
):
    agent, handler = refused_then_the_connection_lost(agents, handlers, logger_for, refuse_again=True)
    resent = [(n, record) for _, n, _, record in agent.numbered[3:]]
    assert [n for n, _ in resent] == [1, 2, 3], "the agent numbers the resend as the client does"
    stats = handler.stats()
    assert stats["nak"] == {"rate_limited": 1}, "refused twice, counted once"
    assert stats["acknowledged"] == 2 and stats["unacknowledged"] == 0


def test_a_refused_record_sent_again_after_a_reconnect_is_counted_by_its_last_answer(
    agents, handlers, logger_for
):
    # Taken by the next connection: one row, so it is acknowledged, not a NAK.
    _, handler = refused_then_the_connection_lost(agents, handlers, logger_for, refuse_again=False)
    stats = handler.stats()
    assert stats["nak"] == {}, "its last answer was an ACK"
    assert stats["acknowledged"] == 3 and stats["unacknowledged"] == 0


def test_ack_mode_counts_naks_by_reason_and_does_not_resend_them(agents, handlers, logger_for):
    agent = agents(nak=lambda n, line: "rate_limited" if b"refuse me" in line else None).start()
    handler = handlers(acknowledged=True)
    log = logger_for(handler)
    log.info("keep 1")
    log.info("refuse me")
    log.info("keep 2")
    log.info("refuse me")
    assert handler.flush(5)

    stats = handler.stats()
    assert stats["nak"] == {"rate_limited": 2}
    assert stats["acknowledged"] == 2 and stats["unacknowledged"] == 0 and stats["queued_bytes"] == 0

    agent.restart()
    log.info("keep 3")
    assert handler.flush(5)
    assert [r["message"] for r in agent.records()] == ["keep 1", "keep 2", "keep 3"]
    assert len(agent.rejected) == 2, "NAK'd records are not sent again"


def test_ack_mode_never_evicts_records_awaiting_acknowledgement(agents, handlers, logger_for):
    agent = agents()
    agent.hold_acks = True
    agent.start()
    handler = handlers(acknowledged=True, max_queue_records=4, drop_below_warning_at=None)
    log = logger_for(handler)
    for i in range(4):
        log.error("awaiting ack %d", i)
    assert agent.wait_for_lines(4)
    log.critical("no room: sent records still count")
    stats = handler.stats()
    assert stats["unacknowledged"] == 4
    assert stats["dropped"] == {"full": {"fatal": 1}}

    agent.hold_acks = False
    assert handler.flush(5)
    log.error("room again")
    assert handler.flush(5)
    messages = [r["message"] for r in agent.records() if "sluice.client" not in r]
    assert messages == [f"awaiting ack {i}" for i in range(4)] + ["room again"]
    assert any(r.get("sluice.client") == "dropped" for r in agent.records())


def test_an_agent_that_closes_every_connection_at_once_is_connected_to_with_backoff(tmp_path, handlers, logger_for):
    # As the agent does over its max_connections, or for a peer it does not allow.
    path = str(tmp_path / "closing.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    accepted = 0
    stop = False

    def close_each() -> None:
        nonlocal accepted
        server.settimeout(0.1)
        while not stop:
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted += 1
            conn.close()

    closer = threading.Thread(target=close_each, daemon=True)
    closer.start()
    try:
        handler = handlers(socket_path=path)
        log = logger_for(handler)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            log.info("into a closed door")
            time.sleep(0.001)
    finally:
        stop = True
        closer.join(2)
        server.close()
    # 20 ms doubling to 2 s: about seven connections in a second, not one per record written.
    assert accepted <= 15, f"{accepted} connections in a second"
