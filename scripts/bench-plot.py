"""Plots of one scripts/bench run: reads results.json, outage_timeseries.csv and
pg_stall_timeseries.csv from the run's folder and writes outage_throughput.png (records/s ingested
and delivered over time, the outage shaded), outage_rss.png (agent RSS and spooled records over
time), pg_stall.png (records/s ingested, delivered and stored while PostgreSQL stalls, with the
persister's backlog) and write_latency.png (the distribution of write-call latency per scenario,
against the ingest ceiling's).

    python scripts/bench-plot.py bench/results/<time>
"""

import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rates(rows, column):
    """Per-interval rate of a counter column: (mid-times, records/s)."""
    times, values = [], []
    for before, after in zip(rows, rows[1:]):
        dt = after["seconds"] - before["seconds"]
        if dt > 0:
            times.append((before["seconds"] + after["seconds"]) / 2)
            values.append((after[column] - before[column]) / dt)
    return times, values


def series(path: Path):
    """A time-series CSV of the run as rows of floats."""
    with path.open() as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def save(fig, ax, path: Path, twin=None) -> None:
    """One legend for the axes (and a twin y-axis, if any), then the PNG."""
    if twin is None:
        ax.legend()
    else:
        lines, labels = ax.get_legend_handles_labels()
        more_lines, more_labels = twin.get_legend_handles_labels()
        ax.legend(lines + more_lines, labels + more_labels, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(folder: Path) -> None:
    results = json.loads((folder / "results.json").read_text())
    rows = series(folder / "outage_timeseries.csv")
    outage = results["outage"]["outage"]
    title = f"{results['when']} — {results['machine']}"

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for column, label in (("ingested", "ingested (socket)"), ("delivered", "delivered (Kafka-acked)")):
        times, values = rates(rows, column)
        ax.plot(times, values, label=label)
    ax.axvspan(outage["from_s"], outage["to_s"], color="red", alpha=0.12, label="broker stopped")
    ax.set_xlabel("seconds")
    ax.set_ylabel("records/s")
    ax.set_title(f"Broker outage at {results['outage']['rate']} records/s, disk buffer\n{title}", fontsize=9)
    save(fig, ax, folder / "outage_throughput.png")

    fig, ax = plt.subplots(figsize=(9, 4.5))
    times = [row["seconds"] for row in rows]
    ax.plot(times, [row["rss_mib"] for row in rows], label="agent RSS (MiB)")
    ax.axvspan(outage["from_s"], outage["to_s"], color="red", alpha=0.12, label="broker stopped")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    spooled = ax.twinx()
    spooled.plot(times, [row["spooled"] for row in rows], color="tab:green", label="records in the spool")
    spooled.set_ylabel("records in the spool")
    ax.set_title(f"Agent memory and spool during the outage\n{title}", fontsize=9)
    save(fig, ax, folder / "outage_rss.png", twin=spooled)

    stall_rows = series(folder / "pg_stall_timeseries.csv")
    stall = results["pg_stall"]["stall"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for column, label in (
        ("ingested", "ingested (socket)"),
        ("delivered", "delivered (Kafka-acked)"),
        ("rows", "stored (PostgreSQL rows)"),
    ):
        times, values = rates(stall_rows, column)
        ax.plot(times, values, label=label)
    ax.axvspan(stall["from_s"], stall["to_s"], color="red", alpha=0.12, label="PostgreSQL stalled")
    ax.set_xlabel("seconds")
    ax.set_ylabel("records/s")
    backlog = ax.twinx()
    backlog.plot(
        [row["seconds"] for row in stall_rows],
        [row["delivered"] - row["rows"] for row in stall_rows],
        color="tab:gray",
        linestyle="--",
        label="persister backlog (records)",
    )
    backlog.set_ylabel("records in Kafka, not yet rows")
    ax.set_title(f"PostgreSQL stalled at {results['pg_stall']['rate']} records/s\n{title}", fontsize=9)
    save(fig, ax, folder / "pg_stall.png", twin=backlog)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    runs = (
        ("ingest ceiling", results["ceilings"]["ingest"]),
        ("sluice, max rate", results["steady"]["load"]),
        ("rsyslog, max rate", results["rsyslog"]["load"]),
        (f"sluice, {results['fixed_rate']['rate']}/s", results["fixed_rate"]["load"]),
        ("sluice, broker outage", results["outage"]["load"]),
        ("sluice, PostgreSQL stalled", results["pg_stall"]["load"]),
    )
    for label, load in runs:
        buckets = load["write_latency_histogram"]
        total = sum(b["count"] for b in buckets)
        seen, xs, ys = 0, [], []
        for bucket in buckets:
            seen += bucket["count"]
            xs.append(bucket["le_us"])
            ys.append(1 - seen / total if seen < total else 1 / total)
        ax.step(xs, ys, where="post", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("write() call latency, µs (bucket upper bound)")
    ax.set_ylabel("fraction of calls slower")
    ax.set_title(f"What the app feels: write-call latency\n{title}", fontsize=9)
    save(fig, ax, folder / "write_latency.png")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
