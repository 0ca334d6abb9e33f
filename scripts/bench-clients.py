"""What each client's logging call costs the app (issue 31), beside the anchor a team would use
instead, in the same run: the agent up (shipping to the stack's Kafka), the agent stopped (no
socket), and Kafka unreachable (the agent up, its broker a closed loopback port).

Run by ``scripts/bench-clients`` (which builds what it needs); prints a table per condition and
writes ``results.json`` and ``summary.md`` to ``--results``. Each client's benchmark prints one
JSON line per variant (``client``, ``variant``, ``calls``, ``p50_ns``, ``p99_ns``, ``p999_ns``,
``max_ns``, ``over_1ms`` and what else it measures); this script only runs them and collects.
A benchmark, not a test: it asserts nothing but that each benchmark ran.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))
from real_agent import RealAgent  # noqa: E402  (the Python client's test helper: one agent, stopped by pid)

CONDITIONS = ("agent up", "agent stopped", "kafka unreachable")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def benchmarks(args):
    """(name, argv, cwd, env) of each client's benchmark; the socket comes as ``SLUICE_SOCKET``."""
    runs = [
        (
            "python",
            [args.python, os.path.join(ROOT, "clients/python/bench/logging_call.py"),
             "--calls", str(args.calls), "--rate", str(args.rate)],
            ROOT,
            {"PYTHONPATH": os.path.join(ROOT, "clients/python/src"), "PYTHONDONTWRITEBYTECODE": "1"},
        )
    ]
    go_bench = os.path.join(ROOT, "clients/go/bench_test.go")
    if os.path.exists(go_bench):
        runs.append((
            "go",
            ["go", "test", "-run", "^$", "-bench", "BenchmarkLoggingCall", "-benchtime", f"{args.calls}x", "-count", "1", "."],
            os.path.join(ROOT, "clients/go"),
            {"SLUICE_BENCH_JSON": "1", "SLUICE_BENCH_RATE": str(args.rate)},
        ))
    java_jar = os.path.join(ROOT, "clients/java/sluice-bench/target/benchmarks.jar")
    if os.path.exists(java_jar):
        runs.append((
            "java",
            ["java", "-jar", java_jar, "-rate", str(args.rate), "-calls", str(args.calls)],
            ROOT,
            {},
        ))
    return runs


def run_condition(condition, socket_path, args):
    results = []
    for name, argv, cwd, extra in benchmarks(args):
        env = dict(os.environ, SLUICE_SOCKET=socket_path, **extra)
        started = time.monotonic()
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"{name} benchmark failed ({condition}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        # A result is a JSON object on a line of its own, or after `go test -bench`'s name.
        lines = [json.loads(line[line.index("{"):]) for line in done.stdout.splitlines() if line.rstrip().endswith("}") and "{" in line]
        if not lines:
            raise SystemExit(f"{name} benchmark printed no result ({condition}):\n{done.stdout[-3000:]}")
        for line in lines:
            line["condition"] = condition
            line["seconds"] = round(time.monotonic() - started, 1)
            results.append(line)
            print(json.dumps(line), flush=True)
    return results


def table(results):
    rows = ["| condition | client | variant | calls/s | p50 ns | p99 ns | p99.9 ns | max ns | calls > 1 ms | allocated per call (caller) | dropped |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        if "allocs_per_call" in r:
            alloc = f"{r['allocs_per_call']:.2f} objects"
        elif "bytes_per_call" in r:
            alloc = f"{r['bytes_per_call']:.0f} B"
        elif "blocks_per_call" in r:
            alloc = f"{r['blocks_per_call']:.2f} blocks"
        else:
            alloc = ""
        rows.append(
            f"| {r['condition']} | {r['client']} | {r['variant']} | {r.get('calls_per_second', '')} | "
            f"{r['p50_ns']:,} | {r['p99_ns']:,} | {r['p999_ns']:,} | {r['max_ns']:,} | {r['over_1ms']} | "
            f"{alloc} | {r.get('dropped', '')} |"
        )
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="the sluice binary (release)")
    parser.add_argument("--brokers", required=True, help="the stack's Kafka")
    parser.add_argument("--results", required=True)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=20_000, help="calls a second each benchmark paces itself to")
    args = parser.parse_args()
    os.makedirs(args.results, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="sluice-bench-clients")
    socket_path = os.path.join(folder, "sluice.sock")
    results = []
    for condition in CONDITIONS:
        agent = None
        if condition != "agent stopped":
            brokers = args.brokers if condition == "agent up" else f"127.0.0.1:{closed_port()}"
            directory = os.path.join(folder, condition.replace(" ", "-"))
            os.makedirs(directory)
            agent = RealAgent(args.binary, brokers, directory, socket_path)
        try:
            if agent is not None:
                agent.start()  # inside the try: an agent that never got ready is stopped too
            print(f"== {condition}", flush=True)
            results += run_condition(condition, socket_path, args)
        finally:
            if agent is not None and agent.running():
                agent.terminate()
    summary = (
        f"# The clients' logging call, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n\n"
        f"`scripts/bench-clients` ({args.calls:,} calls per variant at {args.rate:,} calls/s)\n\n" + table(results) + "\n"
    )
    with open(os.path.join(args.results, "results.json"), "w", encoding="utf-8") as out:
        json.dump({"calls": args.calls, "rate": args.rate, "results": results}, out, indent=2)
    with open(os.path.join(args.results, "summary.md"), "w", encoding="utf-8") as out:
        out.write(summary)
    print("\n" + summary)


if __name__ == "__main__":
    main()
