"""From a ``logging.LogRecord`` to one line the agent accepts.

Owns: the record's JSON fields (level, logger, message, time, thread, process, the stack trace
rendered while the exception is still at hand, ``extra`` fields, registered context variables,
OpenTelemetry ids); making every line storable (U+0000 and lone surrogates become U+FFFD, bytes
that are not UTF-8 are decoded with U+FFFD, nesting is capped below the agent's
``max_json_depth``); and cutting a record longer than ``max_record_size`` so it fits (message
capped, stack frames elided from the middle, ``"truncated": true``) instead of having the
agent refuse all of it.

Must not: do I/O, take any lock, or raise on odd input (a ``str()`` that raises, a cycle, a
NaN): it runs on the application's thread, inside ``emit``.
"""

from __future__ import annotations

import contextvars
import importlib
import json
import logging
import math
import time
import traceback
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

#: Deepest nesting kept in ``extra`` values; deeper values become their ``str()``. The record is
#: one level and the agent refuses beyond 64 (``ingest.max_json_depth``).
MAX_EXTRA_DEPTH = 16

#: The ``LogRecord`` attributes that are not ``extra`` fields.
STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

#: Fields this module writes; an ``extra`` field with one of these names is kept as
#: ``"extra.<name>"`` instead of replacing it.
CORE_FIELDS = (
    "time",
    "level",
    "logger",
    "message",
    "thread",
    "process",
    "task",
    "trace_id",
    "span_id",
    "stack_trace",
    "stack_info",
    "format_error",
    "truncated",
    "elided_fields",
)

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)
_encode = _ENCODER.encode

#: The level words every client writes: OpenTelemetry's severity names, lower-cased (trace,
#: debug, info, warn, error, fatal), so one query finds warnings from every language. Python's
#: WARNING is ``warn`` and CRITICAL ``fatal``; a level of the app's own keeps its name.
_LEVEL_NAMES: Dict[int, str] = {logging.WARNING: "warn", logging.CRITICAL: "fatal"}


def level_name(levelno: int) -> str:
    """``"info"``, ``"warn"``…: the record's level word (``_LEVEL_NAMES``; the persister's
    ``level`` column is lower-case)."""
    name = _LEVEL_NAMES.get(levelno)
    if name is None:
        name = str(logging.getLevelName(levelno)).lower().replace(" ", "_")
        _LEVEL_NAMES[levelno] = name
    return name


def rfc3339(timestamp: float) -> str:
    """``2026-11-30T03:04:05.123456Z``: UTC, microseconds."""
    micros = int(round(timestamp * 1_000_000))
    seconds, micros = divmod(micros, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


def _json_len(value: Any) -> int:
    """Bytes ``value`` takes in the line."""
    return len(_encode(value).encode("utf-8"))


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:  # a user's __str__ may raise; the record must still go out
        return f"<unprintable {type(value).__name__}>"


class _Repairs:
    """How many characters were replaced while building one record."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


def clean_str(text: str, repairs: _Repairs) -> str:
    """``text`` without U+0000 or lone surrogates (each becomes U+FFFD, counted); a surrogate
    pair (``"\\ud83d\\ude00"`` as two code points) becomes its character."""
    if "\x00" in text:
        repairs.count += text.count("\x00")
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        before = text.count("\ufffd")
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        repairs.count += text.count("\ufffd") - before
    return text


def _clean(value: Any, repairs: _Repairs) -> Any:
    """``clean_str`` over every string (keys too) of a JSON-ready value."""
    if isinstance(value, str):
        return clean_str(value, repairs)
    if isinstance(value, dict):
        return {clean_str(k, repairs): _clean(v, repairs) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, repairs) for v in value]
    return value


def jsonable(value: Any, repairs: _Repairs, depth: int = 0) -> Any:
    """A JSON-ready copy of an ``extra`` value: containers copied (so a cycle ends at the depth
    cap), bytes decoded (U+FFFD where not UTF-8, counted), NaN and infinities as strings,
    anything else as its ``isoformat()`` or ``str()``."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", "replace")
            repairs.count += max(1, text.count("\ufffd"))
            return text
    if depth >= MAX_EXTRA_DEPTH:
        return _safe_str(value)
    try:
        if isinstance(value, Mapping):
            return {
                (k if isinstance(k, str) else _safe_str(k)): jsonable(v, repairs, depth + 1)
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple, set, frozenset)):
            return [jsonable(v, repairs, depth + 1) for v in value]
        isoformat = getattr(value, "isoformat", None)
        if callable(isoformat):
            return _safe_str(isoformat())
    except Exception:  # a mapping whose items() raises, say
        pass
    return _safe_str(value)


def _is_frame(chunk: str) -> bool:
    """A chunk of a rendered traceback that is a frame (elidable), not a header, an exception
    line or the text joining chained exceptions (always kept)."""
    return chunk.startswith("  ")


def render_exception(exc_info: Any) -> Optional[List[str]]:
    """The traceback as ``traceback`` renders it, in chunks (one per frame, header or exception
    line). Chained exceptions come root cause first, as Python prints them."""
    if isinstance(exc_info, BaseException):  # a LogRecord made by hand may hold the exception
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    if not isinstance(exc_info, tuple) or len(exc_info) != 3 or exc_info[0] is None:
        return None
    try:
        return list(traceback.TracebackException(*exc_info).format())
    except Exception:  # an exception whose __str__ raises, a broken traceback
        return [f"{_safe_str(exc_info[0])}: <traceback could not be rendered>\n"]


def cut_str(text: str, budget: int, marker: str = "…[truncated]") -> str:
    """``text`` cut at its end so that it takes at most ``budget`` bytes in the line (quotes
    included), ending with ``marker`` when cut."""
    # Every character takes at least a byte: a text longer than the budget is cut without
    # encoding all of it (a 100 MB message costs no more than a 1 MB one).
    if len(text) + 2 <= budget and _json_len(text) <= budget:
        return text
    room = budget - _json_len(marker) + 2
    if room <= 2:
        return ""
    keep = min(len(text), room - 2)
    while keep > 0:
        size = _json_len(text[:keep])
        if size <= room:
            break
        keep = min(keep - 1, int(keep * room / size))
    return text[: max(keep, 0)] + marker


def elide_frames(chunks: List[str], budget: int) -> str:
    """The traceback in at most ``budget`` bytes: frames removed from the middle outwards (the
    root cause's first frames and the last exception's last frames stay, and every exception
    line stays), then, if that is not enough, the text cut at its end (the root cause, first,
    stays)."""
    text = "".join(chunks)
    if _json_len(text) <= budget:
        return text
    frames = [i for i, chunk in enumerate(chunks) if _is_frame(chunk)]
    middle = (len(frames) - 1) / 2
    order = sorted(range(len(frames)), key=lambda j: abs(j - middle))

    def without(k: int) -> str:
        gone = {frames[j] for j in order[:k]}
        out: List[str] = []
        run = 0
        for i, chunk in enumerate(chunks):
            if i in gone:
                run += 1
                continue
            if run:
                out.append(f"  [… {run} frame{'s' if run > 1 else ''} elided …]\n")
                run = 0
            out.append(chunk)
        if run:
            out.append(f"  [… {run} frame{'s' if run > 1 else ''} elided …]\n")
        return "".join(out)

    low, high = 0, len(frames)
    if _json_len(without(high)) <= budget:
        while low < high:  # fewest frames removed that fit
            mid = (low + high) // 2
            if _json_len(without(mid)) <= budget:
                high = mid
            else:
                low = mid + 1
        return without(high)
    return cut_str(without(len(frames)), budget)


def _share(needs: List[int], total: int) -> List[int]:
    """Split ``total`` between ``needs``: small needs in full, large ones equally."""
    alloc = [0] * len(needs)
    remaining = max(total, 0)
    order = sorted(range(len(needs)), key=needs.__getitem__)
    for position, index in enumerate(order):
        alloc[index] = min(needs[index], remaining // (len(order) - position))
        remaining -= alloc[index]
    return alloc


class Formatted:
    """One record as a line (newline included), and what happened to it."""

    __slots__ = ("data", "replaced", "truncated")

    def __init__(self, data: bytes, replaced: bool, truncated: bool) -> None:
        self.data = data
        self.replaced = replaced
        self.truncated = truncated


def _otel_module() -> Any:
    """``opentelemetry.trace`` if it can be imported; it is optional."""
    try:
        return importlib.import_module("opentelemetry.trace")
    except Exception:  # ImportError, or a broken installation
        return None


class RecordFormatter:
    """Builds lines; one per handler, called under the handler's lock."""

    def __init__(
        self,
        max_record_size: int,
        context_vars: Sequence[Tuple[str, contextvars.ContextVar[Any]]] = (),
        otel: Optional[Any] = None,
    ) -> None:
        self.max_record_size = max_record_size
        self.context_vars = list(context_vars)
        self._otel = otel if otel is not None else _otel_module()
        self._second = -1
        self._second_text = ""

    def _time(self, created: float) -> str:
        micros = int(round(created * 1_000_000))
        seconds, micros = divmod(micros, 1_000_000)
        if seconds != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
            self._second = seconds
        return f"{self._second_text}.{micros:06d}Z"

    def format(self, record: logging.LogRecord) -> Formatted:
        """The record as one storable line of at most ``max_record_size`` bytes (plus the
        newline)."""
        repairs = _Repairs()
        doc: Dict[str, Any] = {
            "time": self._time(record.created),
            "level": level_name(record.levelno),
            "logger": record.name,
        }
        try:
            doc["message"] = record.getMessage()
        except Exception as error:  # msg % args failed: keep what was logged, say why
            doc["message"] = _safe_str(record.msg)
            doc["format_error"] = cut_str(
                f"{type(error).__name__}: {_safe_str(error)}; args={_safe_str(record.args)}", 1024
            )
        doc["thread"] = record.threadName
        doc["process"] = record.process
        task = getattr(record, "taskName", None)
        if task is not None:
            doc["task"] = task
        self._add_trace_ids(doc)
        chunks = render_exception(record.exc_info)
        if chunks is not None:
            doc["stack_trace"] = "".join(chunks)
        elif record.exc_text:
            doc["stack_trace"] = record.exc_text
        if record.stack_info:
            doc["stack_info"] = record.stack_info
        for name, var in self.context_vars:
            value = var.get(_MISSING)
            if value is not _MISSING:
                doc[name if name not in doc else f"extra.{name}"] = jsonable(value, repairs)
        for key, value in record.__dict__.items():
            if key not in STANDARD_ATTRS:
                doc[key if key not in doc else f"extra.{key}"] = jsonable(value, repairs)

        text = _encode(doc)
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            data = None
        if data is None or "\\u0000" in text:  # a lone surrogate, or a NUL, somewhere
            doc = _clean(doc, repairs)
            if chunks is not None:
                chunks = [clean_str(chunk, _Repairs()) for chunk in chunks]
            data = _encode(doc).encode("utf-8")
        truncated = False
        if len(data) > self.max_record_size:
            data = self._fit(doc, chunks)
            truncated = True
        return Formatted(data + b"\n", repairs.count > 0, truncated)

    def _add_trace_ids(self, doc: Dict[str, Any]) -> None:
        if self._otel is None:
            return
        try:
            context = self._otel.get_current_span().get_span_context()
            if context.is_valid:
                doc["trace_id"] = format(context.trace_id, "032x")
                doc["span_id"] = format(context.span_id, "016x")
        except Exception:  # a broken or mismatched OpenTelemetry: no ids, never an error
            pass

    def _fit(self, doc: Dict[str, Any], chunks: Optional[List[str]]) -> bytes:
        """Cut a record that is too long: ``extra`` fields first (the largest become cut
        strings, then are left out, named in ``elided_fields``), then the message and the
        stack trace share what is left."""
        limit = self.max_record_size
        doc["truncated"] = True
        extra = [k for k in doc if k not in CORE_FIELDS]
        sizes = {k: _json_len(k) + _json_len(doc[k]) + 2 for k in extra}
        share = limit // 4
        if sum(sizes.values()) > share:
            cap = max(limit // 16, 64)
            for key in sorted(extra, key=sizes.__getitem__, reverse=True):
                if sizes[key] > cap:
                    value = doc[key]
                    doc[key] = cut_str(value if isinstance(value, str) else _encode(value), cap)
                    sizes[key] = _json_len(key) + _json_len(doc[key]) + 2
            elided = []
            for key in sorted(extra, key=sizes.__getitem__, reverse=True):
                if sum(sizes.values()) <= share:
                    break
                del doc[key]
                del sizes[key]
                elided.append(key)
            if elided:
                doc["elided_fields"] = cut_str(",".join(elided), 1024)

        texts = {k: doc[k] for k in ("message", "stack_trace", "stack_info") if isinstance(doc.get(k), str)}
        for key in texts:
            doc[key] = ""
        margin = 0
        for _ in range(4):
            available = limit - len(_encode(doc).encode("utf-8")) - margin
            keys = list(texts)
            budgets = _share([_json_len(texts[k]) - 2 for k in keys], available)
            for key, budget in zip(keys, budgets):
                if key == "stack_trace" and chunks is not None:
                    doc[key] = elide_frames(chunks, budget + 2)
                else:
                    doc[key] = cut_str(texts[key], budget + 2)
            data = _encode(doc).encode("utf-8")
            if len(data) <= limit:
                return data
            margin += len(data) - limit + 64
        # Last resort (a logger name of a megabyte?): the bare minimum, cut to fit.
        minimal = {"time": doc["time"], "level": doc["level"], "logger": cut_str(doc["logger"], 128)}
        minimal["message"] = cut_str(texts.get("message", ""), limit - len(_encode(minimal)) - 40)
        minimal["truncated"] = True
        return _encode(minimal).encode("utf-8")


_MISSING = object()
