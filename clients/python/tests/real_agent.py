"""The real ``sluice agent`` as a child process, for the tests that run the client against it.

Owns: writing the agent's TOML config (one ``lines`` listener on the test's socket, the admin
server on a loopback port the kernel picks and writes to ``admin_address_file``, the Kafka broker
from ``SLUICE_TEST_KAFKA`` and a topic no other run uses), starting it and waiting for
``/readyz`` (which does not wait for Kafka), stopping it (SIGTERM and wait; SIGKILL where a test means it), and reading its
Prometheus metrics.

The topic is not created here: the stack's broker has ``auto.create.topics.enable=true``
(scripts/kafka/server.properties.in) and the agent's producer asks for the topic's metadata
before its first send, which creates it (librdkafka's ``allow.auto.create.topics`` defaults to
true for producers), as in the Rust integration tests that use a fresh topic without
``create_topic``.

Must not: start anything but the agent, listen beyond loopback, or leave a process running
(``RealAgents.stop_all`` runs in a fixture finalizer).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional, Tuple

#: How long an agent may take to bind its admin server and answer ``/readyz`` with ``ready``.
READY_TIMEOUT_SECONDS = 30.0
#: How long a SIGTERM'd agent may drain (its ``drain_timeout`` is 5 s) before it is killed.
STOP_TIMEOUT_SECONDS = 15.0

_counter = itertools.count()
# Loopback only, and never through a proxy the environment may name.
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def unique_topic(prefix: str = "pyclient") -> str:
    """A topic name no other test or run uses (as ``harness::unique`` makes them)."""
    return f"{prefix}_{os.getpid()}_{next(_counter)}_{time.time_ns() % 1_000_000_000}"


class Metrics:
    """One scrape of ``/metrics``: samples by name, each as ``(labels, value)``."""

    def __init__(self, text: str) -> None:
        self.samples: Dict[str, List[Tuple[str, float]]] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            name, _, labels = series.partition("{")
            self.samples.setdefault(name, []).append((labels.rstrip("}"), float(value)))

    def total(self, name: str) -> float:
        """The sum over every series of ``name`` (0 if it has none)."""
        return sum(value for _, value in self.samples.get(name, []))

    def nonzero(self, name: str) -> Dict[str, float]:
        """The series of ``name`` that are not zero, by their labels."""
        return {labels: value for labels, value in self.samples.get(name, []) if value}


class RealAgent:
    """One agent config (socket, spool, topic) in ``directory``; started and stopped as often as
    a test likes, always on the same socket and spool."""

    def __init__(
        self,
        binary: str,
        brokers: str,
        directory: str,
        socket_path: str,
        *,
        buffer: str = "memory",
        ack_point: Optional[str] = None,
        max_record_size: Optional[str] = None,
    ) -> None:
        self.binary = binary
        self.directory = directory
        self.socket_path = socket_path
        self.topic = unique_topic()
        self.config_path = os.path.join(directory, "agent.toml")
        self.admin_file = os.path.join(directory, "agent.admin")
        self.log_path = os.path.join(directory, "agent.log")
        self.process: Optional[subprocess.Popen] = None
        self.admin: Optional[str] = None
        self.starts = 0
        lines = [
            "[log]",
            'level = "info,librdkafka=warn"',
            'format = "json"',
            "[kafka]",
            f'brokers = "{brokers}"',
            f'topic = "{self.topic}"',
            "[agent]",
            'admin_listen = "127.0.0.1:0"',
            f'admin_address_file = "{self.admin_file}"',
            'drain_timeout = "5s"',
            "[ingest]",
        ]
        if ack_point is not None:
            lines.append(f'ack_point = "{ack_point}"')
        lines += ["[ingest.listeners.default]", 'protocol = "lines"', f'socket = "{socket_path}"']
        if max_record_size is not None:
            lines.append(f'max_record_size = "{max_record_size}"')
        lines += ["[buffer]", f'type = "{buffer}"']
        if buffer == "disk":
            lines += [f'path = "{os.path.join(directory, "spool")}"', 'fsync = "10ms"']
        with open(self.config_path, "w", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")

    # Lifecycle. -------------------------------------------------------------------------------

    def start(self) -> "RealAgent":
        """Start the agent and wait until ``/readyz`` answers 200: its socket takes records
        (``ready``, or ``ready (accepting records; …)`` while Kafka does not answer)."""
        assert not self.running(), "the agent is already running"
        try:
            os.unlink(self.admin_file)  # a restart binds another port: wait for the new one
        except FileNotFoundError:
            pass
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [self.binary, "agent", "--config", self.config_path],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
            )
        self.admin = None
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while True:
            assert self.running(), f"the agent exited ({self.process.returncode}); log:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"the agent was not ready in time; log:\n{self.log_tail()}"
            if self.admin is None:
                self.admin = self._read_admin()
            if self.admin is not None:
                status, body = self._get("/readyz")
                if status == 200 and body.startswith("ready"):
                    return self
            time.sleep(0.05)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self, timeout: float = STOP_TIMEOUT_SECONDS) -> int:
        """SIGTERM, then wait for the drain to end; SIGKILL only if it outlives ``timeout``."""
        process = self.process
        assert process is not None, "the agent was never started"
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        process = self.process
        assert process is not None, "the agent was never started"
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait()

    # What it says. ----------------------------------------------------------------------------

    def metrics(self) -> Metrics:
        status, body = self._get("/metrics")
        assert status == 200, f"/metrics answered {status}: {body[:200]}"
        return Metrics(body)

    def wait_for_metrics(self, condition, timeout: float = 30.0) -> Metrics:
        """Scrape until ``condition(metrics)`` holds; the last scrape (check it again to see why
        it did not)."""
        deadline = time.monotonic() + timeout
        while True:
            metrics = self.metrics()
            if condition(metrics) or time.monotonic() > deadline:
                return metrics
            time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as file:
                text = file.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _read_admin(self) -> Optional[str]:
        try:
            with open(self.admin_file, encoding="utf-8") as file:
                address = file.read().strip()
        except OSError:
            return None
        return address or None

    def _get(self, path: str) -> Tuple[int, str]:
        try:
            with _http.open(f"http://{self.admin}{path}", timeout=5) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode("utf-8", "replace")
        except OSError as error:  # not listening yet, or gone
            return 0, str(error)


class RealAgents:
    """Makes ``RealAgent``\\ s; ``stop_all`` stops every process they started."""

    def __init__(self, binary: str, brokers: str, directory: str, socket_path: str) -> None:
        self.binary = binary
        self.brokers = brokers
        self.directory = directory
        self.socket_path = socket_path
        self.made: List[RealAgent] = []

    def __call__(self, **options) -> RealAgent:
        agent = RealAgent(self.binary, self.brokers, self.directory, self.socket_path, **options)
        self.made.append(agent)
        return agent

    def stop_all(self) -> None:
        for agent in self.made:
            if agent.running():
                agent.terminate()
