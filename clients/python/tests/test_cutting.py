"""Records the agent would refuse are repaired or cut on the client, never refused whole."""

from __future__ import annotations

import json
import logging
import sys

from fake_agent import agent_check
from sluice_logging._format import RecordFormatter, elide_frames


def recurse(depth: int) -> None:
    """Alternates with ``recurse_too`` so Python's traceback does not fold the frames."""
    if depth == 0:
        raise ValueError("root cause at the bottom")
    recurse_too(depth - 1)


def recurse_too(depth: int) -> None:
    recurse(depth)


def record_with(message: str = "m", exc_info=None, **extra) -> logging.LogRecord:
    record = logging.LogRecord("cut", logging.ERROR, __file__, 1, message, (), exc_info)
    record.__dict__.update(extra)
    return record


def chained_exc_info(depth: int):
    try:
        try:
            recurse(depth)
        except ValueError as error:
            raise RuntimeError("the outer failure") from error
    except RuntimeError:
        return sys.exc_info()


def test_an_oversize_record_is_cut_with_truncated_true_and_the_root_cause_kept(agent, handlers, logger_for):
    limit = 4096
    handler = handlers(max_record_size=limit)
    log = logger_for(handler)
    try:
        try:
            recurse(200)
        except ValueError as error:
            raise RuntimeError("the outer failure") from error
    except RuntimeError:
        log.exception("x" * 10_000)

    assert handler.flush(5)
    (record,) = agent.expect(1)
    assert len(agent.lines[0]) <= limit
    assert record["truncated"] is True
    assert record["message"].startswith("xxxx") and record["message"].endswith("…[truncated]")
    trace = record["stack_trace"]
    assert trace.startswith("Traceback (most recent call last):")
    assert "ValueError: root cause at the bottom" in trace
    assert "RuntimeError: the outer failure" in trace
    assert "frames elided" in trace
    assert handler.stats()["truncated"] == 1


def test_frames_are_elided_from_the_middle_keeping_both_ends():
    formatter = RecordFormatter(1024 * 1024)
    doc = json.loads(formatter.format(record_with(exc_info=chained_exc_info(50))).data)
    chunks = [line + "\n" for line in doc["stack_trace"].split("\n")[:-1]]
    cut = elide_frames(chunks, 3000)
    assert len(json.dumps(cut, ensure_ascii=False).encode()) <= 3000
    lines = cut.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "in chained_exc_info" in lines[1], "the root cause's first frame stays"
    assert lines[-1] == "RuntimeError: the outer failure"
    assert "in chained_exc_info" in lines[-3], "the last exception's last frame stays"
    assert "ValueError: root cause at the bottom" in cut


def test_huge_extra_fields_are_cut_before_the_message(agent, handlers, logger_for):
    handler = handlers(max_record_size=2048)
    logger_for(handler).warning("the message matters", extra={"blob": "b" * 50_000, "small": 1})
    assert handler.flush(5)
    (record,) = agent.expect(1)
    assert len(agent.lines[0]) <= 2048
    assert record["message"] == "the message matters"
    assert record["small"] == 1 and record["truncated"] is True
    assert record["blob"].startswith("bbb")


def test_records_within_the_limit_are_not_touched():
    formatter = RecordFormatter(1024)
    formatted = formatter.format(record_with("fine"))
    assert not formatted.truncated and b"truncated" not in formatted.data


def test_every_cut_record_fits_and_is_storable_whatever_its_shape():
    formatter = RecordFormatter(512)
    shapes = [
        record_with("\\" * 5000),  # every byte doubles when escaped
        record_with("\x01" * 5000),  # every byte becomes \u0001
        record_with("é😀" * 2000),
        record_with("m", exc_info=chained_exc_info(30)),
        record_with("m", **{f"k{i}": "v" * 100 for i in range(50)}),
        record_with("m", **{"k" * 3000: 1}),
    ]
    for record in shapes:
        formatted = formatter.format(record)
        line = formatted.data.rstrip(b"\n")
        assert len(line) <= 512, len(line)
        assert agent_check(line, 512) is None
        assert json.loads(line)["truncated"] is True and formatted.truncated


def test_nul_escaped_nul_lone_surrogates_and_bad_utf8_are_replaced_and_counted(agent, handlers, logger_for):
    handler = handlers()
    log = logger_for(handler)
    log.info("raw \x00 nul")
    log.info("a lone \ud800 surrogate, a pair as code points \ud83d\ude00", extra={"path": "caf\udce9"})
    log.info("bytes", extra={"payload": b"\xff\xfeok", "\x00key": "v"})
    log.info("a literal backslash-u0000 is text: \\u0000")
    log.info("clean")

    assert handler.flush(5)
    records = agent.expect(5)
    assert records[0]["message"] == "raw \ufffd nul"
    assert records[1]["message"] == "a lone \ufffd surrogate, a pair as code points 😀"
    assert records[1]["path"] == "caf\ufffd"
    assert records[2]["payload"] == "\ufffd\ufffdok" and records[2]["\ufffdkey"] == "v"
    assert records[3]["message"] == "a literal backslash-u0000 is text: \\u0000"
    assert handler.stats()["replaced"] == 3, "records with a replacement"
