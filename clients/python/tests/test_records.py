"""What a record looks like when it reaches the agent."""

from __future__ import annotations

import contextvars
import json
import logging
import logging.config
import re
import sys
import types

import pytest

import sluice_logging
from sluice_logging._format import RecordFormatter

request_id: contextvars.ContextVar = contextvars.ContextVar("request_id")


def fail_deeply(depth: int) -> None:
    if depth == 0:
        raise KeyError("root cause")
    fail_deeply(depth - 1)


def test_records_arrive_as_json_with_extra_fields_and_full_stack_traces(agent, handlers, logger_for):
    handler = handlers()
    log = logger_for(handler)

    log.info("paid order %d", 17, extra={"order": {"id": 17, "items": [1, 2]}, "user": "ada"})
    try:
        try:
            fail_deeply(3)
        except KeyError as error:
            raise RuntimeError("payment failed") from error
    except RuntimeError:
        log.exception("checkout broke")

    assert handler.flush(5)
    first, second = agent.expect(2)
    assert first["message"] == "paid order 17"
    assert first["level"] == "info"
    assert first["logger"] == log.name
    assert first["order"] == {"id": 17, "items": [1, 2]}
    assert first["user"] == "ada"
    assert first["process"] > 0 and first["thread"] == "MainThread"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", first["time"])
    assert "stack_trace" not in first

    assert second["level"] == "error"
    trace = second["stack_trace"]
    assert trace.index("KeyError: 'root cause'") < trace.index("RuntimeError: payment failed")
    assert trace.count("in fail_deeply") == 4, "every frame is kept"
    assert "The above exception was the direct cause" in trace


def test_extra_fields_named_like_core_fields_are_kept_under_extra_prefix(agent, handlers, logger_for):
    handler = handlers()
    logger_for(handler).warning("hello", extra={"level": "mine", "time": 3})
    assert handler.flush(5)
    (record,) = agent.expect(1)
    assert record["level"] == "warn" and record["extra.level"] == "mine" and record["extra.time"] == 3


def test_values_json_cannot_hold_become_strings_and_nesting_stays_below_the_agents_limit(
    agent, handlers, logger_for
):
    handler = handlers()
    deep: dict = {}
    node = deep
    for _ in range(100):
        node["next"] = {}
        node = node["next"]
    cycle: list = []
    cycle.append(cycle)

    class Unprintable:
        def __str__(self) -> str:
            raise ValueError("no")

    logger_for(handler).info(
        "odd values",
        extra={"deep": deep, "cycle": cycle, "nan": float("nan"), "obj": Unprintable(), "when": b"bytes"},
    )
    assert handler.flush(5)
    (record,) = agent.expect(1)
    assert record["nan"] == "nan" and record["obj"] == "<unprintable Unprintable>" and record["when"] == "bytes"


def test_context_vars_registered_with_the_handler_go_into_every_record(agent, handlers, logger_for):
    handler = handlers(context_vars=[request_id])
    log = logger_for(handler)
    log.info("outside")
    token = request_id.set("req-42")
    try:
        log.info("inside")
    finally:
        request_id.reset(token)
    assert handler.flush(5)
    outside, inside = agent.expect(2)
    assert "request_id" not in outside
    assert inside["request_id"] == "req-42"


def test_opentelemetry_ids_are_added_when_a_span_is_active(monkeypatch):
    class SpanContext:
        is_valid = True
        trace_id = 0x0AF7651916CD43DD8448EB211C80319C
        span_id = 0x00F067AA0BA902B7

    fake_trace = types.SimpleNamespace(get_current_span=lambda: types.SimpleNamespace(get_span_context=SpanContext))
    monkeypatch.setitem(sys.modules, "opentelemetry", types.SimpleNamespace(trace=fake_trace))
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", fake_trace)
    formatter = RecordFormatter(1024 * 1024)
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "traced", (), None)
    doc = json.loads(formatter.format(record).data)
    assert doc["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert doc["span_id"] == "00f067aa0ba902b7"

    SpanContext.is_valid = False
    assert "trace_id" not in json.loads(formatter.format(record).data)


def test_records_carry_no_trace_ids_without_opentelemetry(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails
    formatter = RecordFormatter(1024 * 1024)
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "plain", (), None)
    assert b"trace_id" not in formatter.format(record).data


def test_a_bad_format_string_still_sends_the_record_and_says_why(agent, handlers, logger_for):
    handler = handlers()
    logger_for(handler).info("%d items", "not a number")
    assert handler.flush(5)
    (record,) = agent.expect(1)
    assert record["message"] == "%d items"
    assert "TypeError" in record["format_error"]


def test_dict_config_builds_the_handler_with_its_options(agent, socket_path):
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "handlers": {
                "sluice": {
                    "class": "sluice_logging.SluiceHandler",
                    "socket_path": socket_path,
                    "level": "INFO",
                    "max_queue_records": 100,
                    "acknowledged": True,
                    "context_vars": ["ext://test_records.request_id"],
                }
            },
            "loggers": {"dictconfigured": {"handlers": ["sluice"], "level": "DEBUG", "propagate": False}},
        }
    )
    log = logging.getLogger("dictconfigured")
    (handler,) = log.handlers
    try:
        assert isinstance(handler, sluice_logging.SluiceHandler)
        assert handler.level == logging.INFO and handler.acknowledged
        log.debug("filtered by the handler's level")
        token = request_id.set("from-dict-config")
        log.info("configured")
        request_id.reset(token)
        assert handler.flush(5)
        (record,) = agent.records()
        assert record["message"] == "configured" and record["request_id"] == "from-dict-config"
        assert handler.stats()["acknowledged"] == 1
    finally:
        handler.close(timeout=0.5)
        log.handlers.clear()


def test_invalid_options_are_refused_at_configuration():
    with pytest.raises(ValueError):
        sluice_logging.SluiceHandler(max_record_size=10)
    with pytest.raises(ValueError):
        sluice_logging.SluiceHandler(drop_below_warning_at=1.5)
