"""What one logging call costs the app: ``SluiceHandler`` next to the anchor a Python team would
use instead, ``QueueHandler`` + ``QueueListener`` writing to a file, in the same run.

Run by ``scripts/bench-clients`` (the agent up, the agent stopped, Kafka unreachable); by hand::

    PYTHONPATH=clients/python/src python clients/python/bench/logging_call.py --socket S

Each variant logs ``--calls`` records (``log.info`` with a format argument and an ``extra``
field) at ``--rate`` calls a second, timing every call with ``perf_counter_ns``, and prints one
JSON line: calls, p50/p99/p99.9/max ns per call, calls over 1 ms, memory blocks allocated per
call (``sys.getallocatedblocks`` before and after, once the handler is idle: what the call left
behind, not what it freed), and the handler's own drop counts. A benchmark, not a test: it
asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import logging.handlers
import os
import queue
import sys
import tempfile
import time

import sluice_logging


def percentile(sorted_ns, fraction):
    return sorted_ns[min(len(sorted_ns) - 1, int(fraction * len(sorted_ns)))]


def measure(log: logging.Logger, calls: int, rate: int):
    """Times each call; paced to ``rate`` calls a second (sleeping between groups of 100)."""
    durations = [0] * calls
    clock = time.perf_counter_ns
    interval = 100 * 1_000_000_000 // rate
    start = next_group = clock()
    blocks_before = sys.getallocatedblocks()
    for i in range(calls):
        before = clock()
        log.info("handled request %d", i, extra={"request_id": i, "route": "/orders"})
        durations[i] = clock() - before
        if i % 100 == 99:
            next_group += interval
            pause = next_group - clock()
            if pause > 0:
                time.sleep(pause / 1e9)
    elapsed = clock() - start
    return durations, elapsed, blocks_before


def summary(variant, durations, elapsed, blocks, extra):
    ordered = sorted(durations)
    return {
        "client": "python",
        "variant": variant,
        "calls": len(durations),
        "calls_per_second": round(len(durations) / (elapsed / 1e9)),
        "p50_ns": percentile(ordered, 0.50),
        "p99_ns": percentile(ordered, 0.99),
        "p999_ns": percentile(ordered, 0.999),
        "max_ns": ordered[-1],
        "over_1ms": sum(1 for d in durations if d > 1_000_000),
        "blocks_per_call": round(blocks / len(durations), 2),
        **extra,
    }


def run_sluice(args):
    handler = sluice_logging.SluiceHandler(socket_path=args.socket, acknowledged=args.acknowledged)
    log = logging.getLogger("bench.sluice")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    # Warm up: the sender thread started, the first connection tried.
    for i in range(1000):
        log.info("warm up %d", i)
    handler.flush(2)
    gc.collect()
    durations, elapsed, blocks_before = measure(log, args.calls, args.rate)
    handler.flush(2)
    blocks = sys.getallocatedblocks() - blocks_before
    stats = handler.stats()
    handler.close()
    log.removeHandler(handler)
    extra = {
        "sent": stats.get("sent"),
        "acknowledged": stats.get("acknowledged"),
        "dropped": stats.get("dropped_total"),
        "connected": stats.get("connected"),
    }
    return summary("SluiceHandler" + (" (acknowledged)" if args.acknowledged else ""), durations, elapsed, blocks, extra)


def run_anchor(args):
    folder = tempfile.mkdtemp(prefix="bench-queuehandler")
    path = os.path.join(folder, "app.log")
    target = logging.FileHandler(path)
    target.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    records: "queue.Queue[logging.LogRecord]" = queue.Queue(-1)  # the stdlib's documented setup
    listener = logging.handlers.QueueListener(records, target)
    listener.start()
    log = logging.getLogger("bench.anchor")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(logging.handlers.QueueHandler(records))
    for i in range(1000):
        log.info("warm up %d", i)
    gc.collect()
    durations, elapsed, blocks_before = measure(log, args.calls, args.rate)
    listener.stop()
    blocks = sys.getallocatedblocks() - blocks_before
    target.close()
    os.unlink(path)
    os.rmdir(folder)
    return summary("QueueHandler -> file (anchor)", durations, elapsed, blocks, {})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default=os.environ.get("SLUICE_SOCKET", "/run/sluice/sluice.sock"))
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--acknowledged", action="store_true")
    parser.add_argument("--only", choices=["sluice", "anchor"])
    args = parser.parse_args()
    if args.only != "anchor":
        print(json.dumps(run_sluice(args)), flush=True)
    if args.only != "sluice":
        print(json.dumps(run_anchor(args)), flush=True)


if __name__ == "__main__":
    main()
