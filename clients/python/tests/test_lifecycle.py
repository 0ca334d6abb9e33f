"""Starting, forking, flushing and closing: bounded waits, and a sender in every process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

PAYLOAD = "p" * 1000


def test_the_sender_starts_with_the_first_record_not_before(agent, handlers, logger_for):
    handler = handlers()
    time.sleep(0.05)
    assert agent.connections == 0, "no connection before there is something to send"
    logger_for(handler).info("first")
    assert agent.expect(1)
    assert agent.connections == 1


def test_flush_returns_true_once_everything_is_written(agent, handlers, logger_for):
    handler = handlers()
    log = logger_for(handler)
    for i in range(1000):
        log.info("record %d", i)
    assert handler.flush(5) is True
    assert handler.stats()["sent"] == 1000 and handler.stats()["queued"] == 0
    assert len(agent.expect(1000)) == 1000


def test_close_returns_within_its_timeout_with_a_stalled_agent(agent, handlers, logger_for):
    handler = handlers(max_queue_bytes=64 * 1024 * 1024, max_queue_records=100_000)
    log = logger_for(handler)
    log.info("connect first")
    assert agent.expect(1)
    agent.stall()
    for _ in range(5000):  # 5 MB: far more than the socket buffers hold
        log.info(PAYLOAD)
    time.sleep(0.2)
    assert handler.stats()["queued"] > 0, "the sender is blocked on the stalled agent"

    started = time.monotonic()
    handler.close(timeout=0.5)
    took = time.monotonic() - started
    # The deadline, the sender's stop and room for a busy machine; below a close that waits the
    # default (2 s) or for the stalled agent.
    assert took < 1.8, f"close took {took:.2f} s"
    stats = handler.stats()
    assert stats["dropped"]["closed"]["info"] > 0, "what was still queued is counted"
    log.info("after close")
    assert handler.stats()["dropped"]["closed"]["info"] == stats["dropped"]["closed"]["info"] + 1


def test_close_waits_only_once_for_an_agent_that_takes_nothing(handlers, logger_for):
    handler = handlers()  # no agent at all
    logger_for(handler).info("never delivered")
    started = time.monotonic()
    assert handler.flush(0.3) is False
    handler.close(timeout=5)  # as logging.shutdown does before Python 3.12: flush, then close
    assert time.monotonic() - started < 4.0, "a close that waited again would take its 5 s"


def test_interpreter_exit_is_bounded_with_a_stalled_agent(agent, socket_path):
    agent.stall()
    script = textwrap.dedent(
        f"""
        import logging, logging.config
        logging.config.dictConfig({{
            "version": 1,
            "handlers": {{"sluice": {{"class": "sluice_logging.SluiceHandler",
                                      "socket_path": {socket_path!r},
                                      "max_queue_bytes": 64 * 1024 * 1024,
                                      "max_queue_records": 100000}}}},
            "root": {{"handlers": ["sluice"], "level": "INFO"}},
        }})
        for _ in range(5000):
            logging.info("p" * 1000)
        print("logged", flush=True)
        """
    )
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "logged" in result.stdout
    # Flush and close default to 2 s each (about 4.3 s in all); a stalled agent holding the exit
    # would reach the 30 s timeout.
    assert took < 15, f"exit took {took:.1f} s"


def test_records_logged_at_exit_reach_the_agent(agent, socket_path):
    script = textwrap.dedent(
        f"""
        import logging, sluice_logging
        logging.basicConfig(handlers=[sluice_logging.SluiceHandler({socket_path!r})], level="INFO")
        for i in range(100):
            logging.info("at exit %d", i)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)
    assert [r["message"] for r in agent.expect(100)] == [f"at exit {i}" for i in range(100)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_restarts_the_sender_in_the_child(agents, handlers, logger_for):
    handler = handlers()
    log = logger_for(handler)
    log.info("queued in the parent before the fork")  # no agent yet: it stays queued

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:  # the child: log, wait for delivery, report through the exit status
        code = 1
        try:
            fresh = handler.stats()["queued"] == 0
            log.info("from the child %d", os.getpid())
            code = 0 if handler.flush(10) and fresh else 2
        finally:
            os._exit(code)

    agent = agents().start()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert handler.flush(5)
    records = agent.expect(2)
    by_message = {r["message"]: r for r in records}
    assert set(by_message) == {"queued in the parent before the fork", f"from the child {pid}"}
    assert by_message[f"from the child {pid}"]["process"] == pid
    assert by_message["queued in the parent before the fork"]["process"] == os.getpid()
    assert agent.connections == 2, "one connection per process"


def test_the_socket_is_SLUICE_SOCKET_when_set_else_the_charts_path(monkeypatch):
    import sluice_logging

    monkeypatch.setenv("SLUICE_SOCKET", "/tmp/from-the-pod-spec.sock")
    from_env = sluice_logging.SluiceHandler()
    monkeypatch.delenv("SLUICE_SOCKET")
    default = sluice_logging.SluiceHandler()
    try:
        assert from_env.socket_path == "/tmp/from-the-pod-spec.sock"
        assert default.socket_path == "/run/sluice/sluice.sock"
    finally:
        from_env.close()
        default.close()
