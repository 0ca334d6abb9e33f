"""Sends log records to a Sluice agent with the stock OpenTelemetry Python SDK, as an app would:
the standard library's logging, the SDK's LoggingHandler and BatchLogRecordProcessor, and the
OTLP exporter over gRPC or HTTP. The integration tests (tests/it/otlp.rs) run it.

Usage: export.py grpc|http ENDPOINT COUNT

Each record i is logged at INFO as "python otlp i" with the attribute n=i, inside a span (so it
carries trace and span ids). Prints "trace_id <hex>", then "flushed" if the SDK's flush
succeeded.
"""

import logging
import sys

from opentelemetry import trace
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider


def main() -> None:
    kind, endpoint, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kind == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        exporter = OTLPLogExporter(endpoint=endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

        exporter = OTLPLogExporter(endpoint=endpoint)
    trace.set_tracer_provider(TracerProvider())
    provider = LoggerProvider(resource=Resource.create({"service.name": "otlp-python"}))
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    log = logging.getLogger("otlp-python")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(LoggingHandler(logger_provider=provider))
    with trace.get_tracer("otlp-python").start_as_current_span("work") as span:
        print("trace_id", format(span.get_span_context().trace_id, "032x"), flush=True)
        for n in range(count):
            log.info("python otlp %d", n, extra={"n": n})
    if provider.force_flush(30_000):
        print("flushed", flush=True)
    provider.shutdown()


if __name__ == "__main__":
    main()
