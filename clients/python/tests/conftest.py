"""Shared fixtures: a socket path per test, a fake agent on it, handlers that are always closed."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Callable, Iterator, List

import pytest

from fake_agent import FakeAgent
from real_agent import RealAgents
from sluice_logging import SluiceHandler


@pytest.fixture
def socket_path() -> Iterator[str]:
    # A short directory: Unix socket paths are limited to ~107 bytes.
    directory = tempfile.mkdtemp(prefix="sluice-py-", dir="/tmp")
    try:
        yield os.path.join(directory, "agent.sock")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def agents(socket_path: str) -> Iterator[Callable[..., FakeAgent]]:
    """Makes fake agents on ``socket_path`` (not started); all are stopped at the end."""
    made: List[FakeAgent] = []

    def make(**options) -> FakeAgent:
        agent = FakeAgent(socket_path, **options)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.stop()


@pytest.fixture
def agent(agents: Callable[..., FakeAgent]) -> FakeAgent:
    return agents().start()


@pytest.fixture
def handlers(socket_path: str) -> Iterator[Callable[..., SluiceHandler]]:
    """Makes handlers on ``socket_path``; each is closed (briefly) at the end."""
    made: List[SluiceHandler] = []

    def make(**options) -> SluiceHandler:
        options.setdefault("socket_path", socket_path)
        handler = SluiceHandler(**options)
        made.append(handler)
        return handler

    yield make
    for handler in made:
        handler.close(timeout=0.2)


_counter = 0


@pytest.fixture
def logger_for() -> Callable[[logging.Handler], logging.Logger]:
    """A fresh, non-propagating logger writing only to the given handler."""
    made: List[logging.Logger] = []

    def make(handler: logging.Handler, level: int = logging.DEBUG) -> logging.Logger:
        global _counter
        _counter += 1
        logger = logging.getLogger(f"sluice.test.{_counter}")
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False
        made.append(logger)
        return logger

    yield make
    for logger in made:
        logger.handlers.clear()


@pytest.fixture
def real_agents(socket_path: str) -> Iterator[RealAgents]:
    """Makes real agents (``SLUICE_BIN``) on ``socket_path``, shipping to ``SLUICE_TEST_KAFKA``;
    every process they started is stopped at the end, whatever the test did."""
    binary = os.environ.get("SLUICE_BIN")
    if not binary:
        pytest.skip("SLUICE_BIN is not set: the path of a built `sluice` binary runs these tests")
    brokers = os.environ.get("SLUICE_TEST_KAFKA")
    if not brokers:
        pytest.skip("SLUICE_TEST_KAFKA is not set: a Kafka bootstrap address (`scripts/stack env`)")
    agents = RealAgents(binary, brokers, os.path.dirname(socket_path), socket_path)
    try:
        yield agents
    finally:
        agents.stop_all()
