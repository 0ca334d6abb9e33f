"""The client against the real agent binary (``SLUICE_BIN``) shipping to a real Kafka
(``SLUICE_TEST_KAFKA``); skipped when ``SLUICE_BIN`` is not set.

What the agent says is read from its Prometheus metrics (docs/METRICS.md): records read
(``sluice_ingest_records_total``), refused at the socket (``sluice_ingest_records_rejected_total``)
and acknowledged by Kafka (``sluice_ship_records_delivered_total``). Counters start from zero in
each agent process.
"""

from __future__ import annotations

import logging
import threading
import time

from real_agent import Metrics
from waiting import wait_until

INGESTED = "sluice_ingest_records_total"
REJECTED = "sluice_ingest_records_rejected_total"
DELIVERED = "sluice_ship_records_delivered_total"
RECOVERED = "sluice_spool_recovered_records_total"
BUFFER_DROPPED = "sluice_buffer_records_dropped_total"
FAILED = "sluice_ship_records_failed_total"


def nothing_lost_by_the_agent(metrics: Metrics) -> dict:
    """Every counter of records the agent refused, dropped or gave up, that is not zero."""
    return {name: metrics.nonzero(name) for name in (REJECTED, BUFFER_DROPPED, FAILED) if metrics.nonzero(name)}


def test_records_logged_through_the_handler_are_delivered_to_kafka_by_the_real_agent(
    real_agents, handlers, logger_for
):
    # The listener and the handler share a small max_record_size, so that the client's cutting
    # meets the agent's own limit.
    agent = real_agents(max_record_size="64 KiB").start()
    handler = handlers(max_record_size=64 * 1024)
    log = logger_for(handler)
    n = 500

    for i in range(n - 3):
        log.info("order %d paid", i, extra={"order_id": i, "amount": i * 1.5, "tags": ["a", "b"], "level": "x"})
    try:
        try:
            raise KeyError("the root cause")
        except KeyError as cause:
            raise RuntimeError("while paying") from cause
    except RuntimeError:
        log.exception("payment failed", extra={"order_id": -1})
    # What the agent refuses (a NUL, a lone surrogate, bytes that are not UTF-8) the client repairs.
    log.warning("a NUL \x00 and a lone surrogate \udce9", extra={"raw": b"\xff\xfe not utf-8"})
    # Longer than max_record_size: the client cuts it, so the agent does not refuse it as too_large.
    log.error("x" * (200 * 1024), extra={"big": "y" * (100 * 1024)})
    handler.close(timeout=10)

    stats = handler.stats()
    assert stats["sent"] == n and stats["dropped_total"] == 0, stats
    assert stats["replaced"] == 1 and stats["truncated"] == 1, stats
    expected = n + stats["reports_sent"]  # in-band drop reports: none without drops
    metrics = agent.wait_for_metrics(lambda m: m.total(DELIVERED) >= expected, timeout=30)
    assert metrics.total(INGESTED) == expected, agent.log_tail()
    assert metrics.total(DELIVERED) == expected, f"Kafka acknowledged {metrics.total(DELIVERED)} of {expected}"
    assert nothing_lost_by_the_agent(metrics) == {}, agent.log_tail()


def test_acknowledged_mode_with_a_disk_buffer_every_record_is_acknowledged_across_an_agent_sigkill(
    real_agents, handlers, logger_for
):
    agent = real_agents(buffer="disk", ack_point="spooled").start()
    handler = handlers(acknowledged=True, flush_timeout=30)
    log = logger_for(handler)
    logged = 0
    stop = threading.Event()

    def log_steadily() -> None:
        nonlocal logged
        while not stop.is_set():
            log.info("record %d", logged, extra={"seq": logged})
            logged += 1
            time.sleep(0.002)

    writer = threading.Thread(target=log_steadily, name="steady-writer", daemon=True)
    writer.start()
    try:
        assert wait_until(lambda: handler.stats()["acknowledged"] >= 500, timeout=30), handler.stats()
        assert handler.stats()["ack_point"] == "spooled"

        agent.kill()  # SIGKILL: no drain; what it spooled and acknowledged must survive
        # The ACK reader reads what the dead agent left in the socket, then loses the
        # connection: from then until the restart, nothing more can be acknowledged.
        assert wait_until(lambda: not handler.stats()["connected"], timeout=10), handler.stats()
        acknowledged_by_the_first = handler.stats()["acknowledged"]
        time.sleep(0.5)  # records keep coming, and queue
        agent.start()  # same socket, same spool
        restarted_at = logged
        assert wait_until(lambda: handler.stats()["acknowledged"] >= restarted_at + 300, timeout=30), handler.stats()
    finally:
        stop.set()
        writer.join(5)
    assert not writer.is_alive()

    assert handler.flush(30), f"not everything was acknowledged: {handler.stats()}"
    stats = handler.stats()
    accounted = stats["acknowledged"] + stats["dropped_total"] + sum(stats["nak"].values())
    assert accounted == logged, f"{logged} logged, {accounted} accounted for: {stats}"
    assert stats["queued"] == 0 and stats["unacknowledged"] == 0 and stats["unconfirmed"] == 0, stats
    assert stats["acknowledged"] >= 0.9 * logged, stats
    assert stats["reconnects"] >= 1, stats
    # Everything not acknowledged before the kill was sent again to the new agent.
    assert stats["sent"] >= logged, stats

    # The second agent delivers what it read and what it found in the spool (records the first
    # one spooled; some of them may be in Kafka already: duplicates are allowed, losses not).
    acknowledged_by_the_second = stats["acknowledged"] - acknowledged_by_the_first
    metrics = agent.wait_for_metrics(
        lambda m: m.total(DELIVERED) >= m.total(INGESTED) + m.total(RECOVERED)
        and m.total(INGESTED) >= acknowledged_by_the_second,
        timeout=30,
    )
    ingested, recovered, delivered = (metrics.total(name) for name in (INGESTED, RECOVERED, DELIVERED))
    assert ingested >= acknowledged_by_the_second, (ingested, acknowledged_by_the_second)
    assert delivered == ingested + recovered, (delivered, ingested, recovered, agent.log_tail())
    assert delivered >= acknowledged_by_the_second
    assert nothing_lost_by_the_agent(metrics) == {}, agent.log_tail()


def test_the_logging_call_stays_fast_while_the_agent_is_stopped_and_records_flow_again_after_it_restarts(
    real_agents, handlers, logger_for
):
    agent = real_agents().start()
    queue_bound = 500
    handler = handlers(max_queue_records=queue_bound)
    log = logger_for(handler)
    for i in range(10):
        log.info("before the stop %d", i)
    assert handler.flush(10)
    assert agent.wait_for_metrics(lambda m: m.total(DELIVERED) >= 10).total(DELIVERED) == 10

    assert agent.terminate() == 0, agent.log_tail()
    durations = []
    for i in range(2000):
        started = time.perf_counter()
        log.info("while the agent is stopped %d", i, extra={"i": i})
        durations.append(time.perf_counter() - started)
    slow = sorted(d for d in durations if d > 0.05)
    # A call that waited for the agent would take a connect or write timeout (a second or more),
    # or a step of the sender's backoff; the allowance is for a busy machine's scheduler.
    assert len(slow) <= 5 and max(durations) < 0.5, f"calls over 50 ms: {[round(d * 1000) for d in slow]}"
    stats = handler.stats()
    assert not stats["connected"] and stats["sent"] == 10, stats
    assert stats["dropped_total"] >= 2000 - queue_bound, stats
    assert set(stats["dropped"]) <= {"full", "high_water"}, stats
    dropped = stats["dropped_total"]

    agent.start()  # a new process: its counters start from zero
    assert handler.flush(15), handler.stats()
    for i in range(100):
        log.info("after the restart %d", i)
    handler.close(timeout=10)

    stats = handler.stats()
    assert stats["dropped_total"] == dropped, "nothing dropped once the agent was back"
    assert stats["queued"] == 0 and stats["sent"] + dropped == 10 + 2000 + 100, stats
    assert stats["reports_sent"] >= 1, "the drops were reported in band when the agent was back"
    expected = stats["sent"] - 10 + stats["reports_sent"]  # the queued ones, the report, the new ones
    metrics = agent.wait_for_metrics(lambda m: m.total(DELIVERED) >= expected, timeout=30)
    assert metrics.total(INGESTED) == expected, agent.log_tail()
    assert metrics.total(DELIVERED) == expected, f"Kafka acknowledged {metrics.total(DELIVERED)} of {expected}"
    assert nothing_lost_by_the_agent(metrics) == {}, agent.log_tail()
