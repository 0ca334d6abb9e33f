#!/usr/bin/env python3
"""The load, the fault timing, the rows check and the table of examples/spring-boot/run.

    bench.py warmup --url URL --threads 3 --requests 100
    bench.py cell   --url URL --mode MODE --fault FAULT --tag TAG --out FILE [...]
    bench.py table  DIR

`cell` runs one mode x fault: THREADS client threads each send REQUESTS `GET /orders/{id}` one
after another (as JMeter's threads did in the seed), each with its own request id
(`TAG-t<thread>-<n>`), and time each request from before the request is written to after the
response is read. With `--fault-cmd`, a thread runs that command once `--fault-at` of the requests
are done; with `--hold`, the clients keep sending past REQUESTS until the command has finished
and `--tail` seconds more, so the whole fault (a broker outage and its restart, say) lies inside
the measured window. Then `--check` counts the rows the logged requests left: each request
answered must be exactly one row. Standard library only (psql for the database).
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import math
import os
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

MODES = ["none", "sync-jdbc", "sluice"]
FAULTS = ["none", "pg-stall", "broker-stop", "agent-kill"]
FAULT_TITLES = {
    "none": "none (baseline)",
    "pg-stall": "3% of inserts stall 5 s",
    "broker-stop": "broker stopped mid-run",
    "agent-kill": "agent SIGKILLed + restarted",
}


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------- the load


class Load:
    def __init__(self, url: str, threads: int, requests: int, tag: str, timeout: float) -> None:
        host_port = url.split("//", 1)[1].split("/", 1)[0]
        self.host, _, port = host_port.partition(":")
        self.port = int(port or 80)
        self.threads = threads
        self.requests = requests
        self.tag = tag
        self.timeout = timeout
        self.done = 0
        self.lock = threading.Lock()
        self.started = 0.0
        self.stop_after_n = threading.Event()  # set: stop once REQUESTS are sent
        self.stop_after_n.set()
        self.samples: List[list] = []  # [thread, n, start_ms, latency_ms, status, request_id, log_us]
        self.errors: List[str] = []

    def run(self) -> None:
        self.started = time.perf_counter()
        workers = [threading.Thread(target=self._client, args=(t,), daemon=True) for t in range(self.threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    def _client(self, thread: int) -> None:
        connection: Optional[http.client.HTTPConnection] = None
        rows = []
        n = 0
        while n < self.requests or not self.stop_after_n.is_set():
            request_id = f"{self.tag}-t{thread}-{n:06d}"
            order = 1 + (thread * 1_000_003 + n) % 100_000
            if connection is None:
                connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            began = time.perf_counter()
            status = 0
            log_us = None
            try:
                connection.request("GET", f"/orders/{order}",
                                   headers={"X-Request-Id": request_id, "X-Client": f"t{thread}"})
                response = connection.getresponse()
                response.read()
                status = response.status
                log_us = response.getheader("X-Log-Time-Us")
            except (OSError, http.client.HTTPException) as error:
                with self.lock:
                    self.errors.append(f"{request_id}: {error!r}")
                connection.close()
                connection = None
            ended = time.perf_counter()
            rows.append([thread, n, round((began - self.started) * 1000, 3),
                         round((ended - began) * 1000, 3), status, request_id,
                         int(log_us) if log_us and log_us.isdigit() else None])
            n += 1
            with self.lock:
                self.done += 1
        if connection is not None:
            connection.close()
        with self.lock:
            self.samples.extend(rows)


def percentile(sorted_values: List[float], p: float) -> float:
    """Nearest rank, as JMeter and most APMs report it."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(samples: List[list]) -> Dict[str, float]:
    latencies = sorted(sample[3] for sample in samples)
    logging = sorted(sample[6] for sample in samples if sample[6] is not None)
    return {
        # The time the logging took inside the request, as the app measured it (X-Log-Time-Us).
        "log_p50_us": percentile(logging, 50) if logging else None,
        "log_p99_us": percentile(logging, 99) if logging else None,
        "log_max_us": logging[-1] if logging else None,
        "requests": len(latencies),
        "mean_ms": round(sum(latencies) / len(latencies), 2) if latencies else None,
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
        "max_ms": latencies[-1] if latencies else None,
        "over_1s": sum(1 for value in latencies if value > 1000),
    }


# ---------------------------------------------------------------------------------- CPU usage


def read_cpu() -> Dict[str, float]:
    """Machine CPU busy/total jiffies, and per watched process utime+stime."""
    with open("/proc/stat", encoding="ascii") as file:
        fields = [int(value) for value in file.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return {"busy": sum(fields) - idle, "total": sum(fields)}


def process_cpu(pid_file: str) -> Optional[tuple]:
    try:
        with open(pid_file, encoding="ascii") as file:
            pid = int(file.read().strip())
        with open(f"/proc/{pid}/stat", encoding="ascii") as file:
            stat = file.read().rsplit(")", 1)[1].split()
        return pid, (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None


def thread_group(name: str) -> str:
    for prefix, group in (("http-nio", "http"), ("sluice-sender", "sluice-sender"), ("sluice-acks", "sluice-acks"),
                          ("C1 Compiler", "jit"), ("C2 Compiler", "jit"), ("G1 ", "gc"), ("GC Thread", "gc"),
                          ("VM Thread", "gc"), ("HikariPool", "jdbc-pool")):
        if name.startswith(prefix):
            return group
    return "other"


def thread_cpu(pid_file: str) -> Dict[int, tuple]:
    """CPU seconds of each thread of the process in pid_file: {tid: (group, seconds)}."""
    threads: Dict[int, tuple] = {}
    try:
        with open(pid_file, encoding="ascii") as file:
            pid = int(file.read().strip())
        tids = os.listdir(f"/proc/{pid}/task")
    except (OSError, ValueError):
        return threads
    ticks = os.sysconf("SC_CLK_TCK")
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8", errors="replace") as file:
                text = file.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        stat = text.rsplit(")", 1)[1].split()
        threads[int(tid)] = (thread_group(name), (int(stat[11]) + int(stat[12])) / ticks)
    return threads


def thread_cpu_delta(before: Dict[int, tuple], after: Dict[int, tuple]) -> Dict[str, float]:
    groups: Dict[str, float] = {}
    for tid, (group, seconds) in after.items():
        groups[group] = groups.get(group, 0.0) + seconds - (before[tid][1] if tid in before else 0.0)
    return {group: round(value, 2) for group, value in sorted(groups.items())}


# ---------------------------------------------------------------------------------- the check


def psql(url: str, sql: str) -> List[List[str]]:
    result = subprocess.run(["psql", "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"psql failed: {result.stderr.strip()}")
    return [line.split("|") for line in result.stdout.splitlines() if line]


def count_rows(args: argparse.Namespace, since: str) -> Dict[str, int]:
    """Rows per request id of this cell's tag."""
    pattern = f"{args.tag}-t[0-9]+-[0-9]+"
    if args.check == "sync-jdbc":
        sql = (f"SELECT request_id, count(*) FROM {args.app_schema}.request_log "
               f"WHERE request_id LIKE '{args.tag}-%' GROUP BY 1")
    else:
        # The persister's rows: a request's record holds its id (message and MDC); count each row once.
        sql = (f"SELECT rid, count(*) FROM (SELECT substring(coalesce(record::text, message) FROM '{pattern}') AS rid "
               f"FROM {args.sluice_schema}.logs WHERE ingest_time >= '{since}'::timestamptz - interval '10 minutes') AS r "
               f"WHERE rid IS NOT NULL GROUP BY 1")
    return {rid: int(count) for rid, count in psql(args.pg_url, sql)}


def check_rows(args: argparse.Namespace, expected: List[str], since: str) -> dict:
    wanted = set(expected)
    began = time.monotonic()
    last_progress, last_found = began, -1
    while True:
        counts = count_rows(args, since)
        found = len(wanted & counts.keys())
        if found == len(wanted):
            if args.check == "sluice":
                time.sleep(3)  # a late duplicate would arrive after its original
                counts = count_rows(args, since)
            break
        now = time.monotonic()
        if found != last_found:
            last_found, last_progress = found, now
            log(f"rows: {found} of {len(wanted)} so far")
        if args.check == "sync-jdbc" or now - last_progress > args.catch_up_timeout:
            break
        time.sleep(2)
    sample = None
    if args.check == "sluice" and expected:
        found_rows = psql(args.pg_url, f"SELECT coalesce(record::text, message) FROM {args.sluice_schema}.logs "
                                       f"WHERE coalesce(record::text, message) LIKE '%{expected[0]}%' LIMIT 1")
        sample = found_rows[0][0] if found_rows else None
    missing = sorted(wanted - counts.keys())
    duplicated = {rid: n for rid, n in counts.items() if n > 1}
    unexpected = sorted(counts.keys() - wanted)
    return {
        "expected": len(wanted),
        "found": len(wanted & counts.keys()),
        "rows": sum(counts.values()),
        "missing": len(missing),
        "missing_sample": missing[:10],
        "duplicated": len(duplicated),
        "duplicated_sample": dict(list(duplicated.items())[:10]),
        "unexpected": len(unexpected),
        "waited_s": round(time.monotonic() - began, 1),
        "ok": not missing and not duplicated and not unexpected,
        "sample_record": sample,
    }


# ---------------------------------------------------------------------------------- commands


def cmd_warmup(args: argparse.Namespace) -> None:
    load = Load(args.url, args.threads, args.requests, f"warmup{int(time.time())}", 60)
    load.run()
    summary = summarize(load.samples)
    log(f"warm-up: {summary['requests']} requests, p50 {summary['p50_ms']:.1f} ms, "
        f"p99 {summary['p99_ms']:.1f} ms, {len(load.errors)} errors")


def cmd_cell(args: argparse.Namespace) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load = Load(args.url, args.threads, args.requests, args.tag, args.timeout)
    fault: dict = {}
    watched = dict(item.split("=", 1) for item in args.watch)
    cpu_before, procs_before = read_cpu(), {name: process_cpu(path) for name, path in watched.items()}
    app_threads_before = thread_cpu(watched["app"]) if "app" in watched else {}

    def run_fault() -> None:
        target = max(1, int(args.fault_at * args.threads * args.requests))
        while load.done < target:
            time.sleep(0.01)
        fault["at_request"] = load.done
        fault["start_s"] = round(time.perf_counter() - load.started, 2)
        result = subprocess.run(args.fault_cmd, shell=True, check=False,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        fault["end_s"] = round(time.perf_counter() - load.started, 2)
        fault["rc"] = result.returncode
        fault["output"] = result.stdout[-2000:]
        if result.returncode != 0:
            log(f"fault command failed ({result.returncode}): {result.stdout[-1000:]}")
        if args.hold:
            time.sleep(args.tail)
            load.stop_after_n.set()

    fault_thread = None
    if args.fault_cmd:
        if args.hold:
            load.stop_after_n.clear()
        fault_thread = threading.Thread(target=run_fault, daemon=True)
        fault_thread.start()
    log(f"{args.mode} x {args.fault}: {args.threads} threads x {args.requests} requests"
        + (f", fault at {args.fault_at:.0%}" if args.fault_cmd else ""))
    load.run()
    duration = time.perf_counter() - load.started
    if fault_thread is not None:
        fault_thread.join()  # the fault is over (the broker is back) before the next cell
    cpu_after = read_cpu()
    app_threads = thread_cpu_delta(app_threads_before, thread_cpu(watched["app"])) if "app" in watched else {}
    cpu = {"machine_busy_pct": round(100 * (cpu_after["busy"] - cpu_before["busy"])
                                     / max(1, cpu_after["total"] - cpu_before["total"]), 1)}
    for name, path in watched.items():
        before, after = procs_before[name], process_cpu(path)
        if before and after and before[0] == after[0]:
            cpu[f"{name}_cpu_s"] = round(after[1] - before[1], 2)
    if app_threads:
        cpu["app_threads_cpu_s"] = app_threads
    load.samples.sort(key=lambda sample: sample[2])
    summary = summarize(load.samples)
    result = {"mode": args.mode, "fault": args.fault, "tag": args.tag, "threads": args.threads,
              "requests_per_thread": args.requests, "duration_s": round(duration, 2), **summary,
              "errors": len(load.errors), "error_sample": load.errors[:10], "fault_run": fault or None,
              "cpu": cpu, "rows": None}
    log(f"{args.mode} x {args.fault}: {summary['requests']} requests in {duration:.1f} s, p50 {summary['p50_ms']:.1f}"
        f" p95 {summary['p95_ms']:.1f} p99 {summary['p99_ms']:.1f} max {summary['max_ms']:.1f} ms,"
        f" {len(load.errors)} errors, cpu {cpu}")
    if args.check != "none":
        answered = [sample[5] for sample in load.samples if sample[4] == 200]
        result["rows"] = check_rows(args, answered, since)
        log(f"rows check: {result['rows']}")
    result["samples_columns"] = ["thread", "n", "start_ms", "latency_ms", "status", "request_id", "log_us"]
    result["samples"] = load.samples
    with open(args.out, "w", encoding="utf-8") as file:
        json.dump(result, file)


def fmt(value: Optional[float]) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def log_time(cell: dict) -> str:
    """The logging's time inside the request: µs below 1 ms, else ms."""
    if cell.get("log_p50_us") is None:
        return "-"
    def one(us: float) -> str:
        return f"{us:,.0f} µs" if us < 1000 else f"{us / 1000:,.0f} ms"
    return " / ".join(one(cell[key]) for key in ("log_p50_us", "log_p99_us", "log_max_us"))


def cmd_table(args: argparse.Namespace) -> None:
    cells = {}
    for path in sorted(glob.glob(os.path.join(args.dir, "cell-*.json"))):
        with open(path, encoding="utf-8") as file:
            cell = json.load(file)
        cell.pop("samples", None)
        cell.pop("samples_columns", None)
        cells[(cell["mode"], cell["fault"])] = cell
    lines = ["| mode | fault | requests | P50 ms | P95 ms | P99 ms | max ms | > 1 s | logging in the request P50 / P99 / max | machine busy | rows check |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    verdicts = []
    failed = False
    for mode in MODES:
        for fault in FAULTS:
            cell = cells.get((mode, fault))
            if cell is None:
                continue
            rows = cell["rows"]
            if rows is None:
                check = "n/a (nothing logged)"
            else:
                check = ("PASS" if rows["ok"] else "FAIL") + f": {rows['found']:,}/{rows['expected']:,} requests, {rows['rows']:,} rows"
                if rows["missing"]:
                    check += f", {rows['missing']} missing"
                if rows["duplicated"]:
                    check += f", {rows['duplicated']} duplicated"
                if rows["unexpected"]:
                    check += f", {rows['unexpected']} unexpected"
                failed |= not rows["ok"]
            if cell["errors"]:
                check += f"; {cell['errors']} request errors"
                failed = True
            lines.append(f"| {mode} | {FAULT_TITLES[fault]} | {cell['requests']:,} | {fmt(cell['p50_ms'])} | "
                         f"{fmt(cell['p95_ms'])} | {fmt(cell['p99_ms'])} | {fmt(cell['max_ms'])} | {cell['over_1s']} | "
                         f"{log_time(cell)} | {cell['cpu']['machine_busy_pct']:.0f}% | {check} |")
    for fault in FAULTS:
        base, sluice = cells.get(("none", fault)), cells.get(("sluice", fault))
        if base and sluice:
            ratio = sluice["p99_ms"] / base["p99_ms"]
            verdicts.append(f"{FAULT_TITLES[fault]}: sluice P99 {fmt(sluice['p99_ms'])} ms vs none {fmt(base['p99_ms'])} ms"
                            f" = {ratio:.3f}x ({'within' if ratio <= 1.05 else 'NOT within'} 5%)")
    table = "\n".join(lines)
    print(table)
    if verdicts:
        print()
        for verdict in verdicts:
            print(f"- {verdict}")
    with open(os.path.join(args.dir, "table.md"), "w", encoding="utf-8") as file:
        file.write(table + "\n\n" + "\n".join(f"- {v}" for v in verdicts) + "\n")
    with open(os.path.join(args.dir, "results.json"), "w", encoding="utf-8") as file:
        json.dump({"cells": list(cells.values()), "verdicts": verdicts}, file, indent=1)
    if failed:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    warmup = commands.add_parser("warmup")
    warmup.add_argument("--url", required=True)
    warmup.add_argument("--threads", type=int, default=3)
    warmup.add_argument("--requests", type=int, default=100)
    cell = commands.add_parser("cell")
    cell.add_argument("--url", required=True)
    cell.add_argument("--mode", choices=MODES, required=True)
    cell.add_argument("--fault", choices=FAULTS, required=True)
    cell.add_argument("--tag", required=True)
    cell.add_argument("--out", required=True)
    cell.add_argument("--threads", type=int, default=3)
    cell.add_argument("--requests", type=int, default=1000, help="per thread")
    cell.add_argument("--timeout", type=float, default=120.0, help="seconds, per request")
    cell.add_argument("--fault-cmd", help="shell command run once --fault-at of the requests are done")
    cell.add_argument("--fault-at", type=float, default=0.2)
    cell.add_argument("--hold", action="store_true", help="send past --requests until the fault command ends")
    cell.add_argument("--tail", type=float, default=5.0, help="with --hold: seconds after the fault command")
    cell.add_argument("--watch", action="append", default=[], help="NAME=PIDFILE: CPU seconds it used")
    cell.add_argument("--check", choices=["none", "sync-jdbc", "sluice"], default="none")
    cell.add_argument("--pg-url")
    cell.add_argument("--app-schema")
    cell.add_argument("--sluice-schema")
    cell.add_argument("--catch-up-timeout", type=float, default=600.0,
                      help="seconds without a new row before the check gives up")
    table = commands.add_parser("table")
    table.add_argument("dir")
    args = parser.parse_args()
    {"warmup": cmd_warmup, "cell": cmd_cell, "table": cmd_table}[args.command](args)


if __name__ == "__main__":
    main()
