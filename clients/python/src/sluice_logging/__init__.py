"""A ``logging`` handler that ships records to the Sluice agent over its local Unix socket.

Owns: the Python side of the agent's ``lines`` protocol (docs/PROTOCOL.md), plain and
acknowledged. Must not: make the application wait for the agent, raise from a logging call, or
need anything beyond the standard library at run time (OpenTelemetry ids are added only when
``opentelemetry`` happens to be importable).

    import logging.config
    logging.config.dictConfig({
        "version": 1,
        "handlers": {"sluice": {"class": "sluice_logging.SluiceHandler"}},
        "root": {"handlers": ["sluice"], "level": "INFO"},
    })
"""

from ._handler import (
    DEFAULT_MAX_QUEUE_BYTES,
    DEFAULT_MAX_QUEUE_RECORDS,
    DEFAULT_MAX_RECORD_SIZE,
    DEFAULT_SOCKET_PATH,
    SluiceHandler,
)

__all__ = [
    "SluiceHandler",
    "DEFAULT_SOCKET_PATH",
    "DEFAULT_MAX_QUEUE_RECORDS",
    "DEFAULT_MAX_QUEUE_BYTES",
    "DEFAULT_MAX_RECORD_SIZE",
]
__version__ = "0.1.0"
