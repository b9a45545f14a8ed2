"""Shared fixtures: brokers run as real processes on free ports of 127.0.0.1; the ``brokers``
marker on the tests that start them."""

from __future__ import annotations

import inspect
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from _broker import BrokerProcess
from samsa.testing.kafka import FAST_FAILOVER, KafkaCluster, KafkaNode
from samsa.testing.oracle import summary_lines
from samsa.testing.tansu import tansu_broker_args

__all__ = ["BrokerProcess"]

# The suite's Kafka nodes compile with C1 only: they serve a few requests each, and C2's
# compiler threads were most of a node's CPU at start-up. (Benchmarks keep the default JIT.)
KafkaNode.default_jvm_args = ("-XX:TieredStopAtLevel=1",)
# ... and map the classes they load from an archive the first of them writes (once per
# machine, in the cache beside Kafka's jars): a node then starts in about half the time.
KafkaNode.share_classes = True

# `make test` (and so CI) runs the property tests on a fixed sequence of examples, so a run
# fails only for a change, never for a new random draw. HYPOTHESIS_PROFILE=explore draws
# fresh examples (and keeps failures in .hypothesis/) for a hunt by hand. No deadline per
# example: time is measured in benchmarks, and a loaded 2-core run took one example 362 ms.
settings.register_profile("repeatable", derandomize=True, database=None, deadline=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


# -- the ``brokers`` marker ----------------------------------------------------------------------
# Set here from what a test uses, not by hand in each file, so a new test is marked too: a
# fixture known to start a broker process (samsa, Apache Kafka or Tansu; those of
# tests/*/conftest.py included), or a test, fixture or helper of theirs whose code starts one.
_BROKER_FIXTURES = frozenset(
    {"broker_factory", "shared_broker", "spark_broker", "tansu"}
    | {"kafka", "kafka_cluster", "differential_kafka", "differential"}
)
_STARTS_A_BROKER = re.compile(r"\b(?:BrokerProcess|KafkaNode|KafkaCluster|tansu_broker_args)\(")
# What else the code reaches: functions it calls by name, fixtures it asks for by name.
_CALLED = re.compile(r"\b([A-Za-z_]\w*)\(")
_ASKED = re.compile(r"getfixturevalue\(\"(\w+)\"\)")
_seen: dict[Callable[..., object], bool] = {}


def _starts_a_broker(func: Callable[..., object]) -> bool:
    func = inspect.unwrap(func)
    if func in _seen:
        return _seen[func]
    _seen[func] = False  # while looking: a cycle is no evidence
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return False
    if _STARTS_A_BROKER.search(source) or _BROKER_FIXTURES.intersection(_ASKED.findall(source)):
        _seen[func] = True
        return True
    names = {*_CALLED.findall(source), *_ASKED.findall(source)}
    reached = [getattr(func, "__globals__", {}).get(n) for n in names]
    found = any(
        callable(f) and inspect.isfunction(inspect.unwrap(f)) and _starts_a_broker(f)
        for f in reached
    )
    _seen[func] = found
    return found


def _uses_brokers(item: pytest.Item) -> bool:
    if _BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    funcs = [getattr(item, "obj", None)]
    info = getattr(item, "_fixtureinfo", None)  # the fixtures the test uses, transitively
    if info is not None:
        funcs += [d.func for defs in info.name2fixturedefs.values() for d in defs]
    return any(f is not None and _starts_a_broker(f) for f in funcs)


# `make test` runs two workers, each taking the next file as it frees up (with
# --no-loadscope-reorder, so xdist keeps this order rather than sending the files with most
# tests first). The Spark and Kafka files are minutes of JVM work each; the others mostly
# wait on brokers and timeouts. They are interleaved, a JVM file between runs of the rest,
# so the two cores stay busy from start to end instead of both workers crowding the JVM
# files at one end of the run. Files stay whole, so module fixtures are built once.
_JVM_DIRS = ("spark", "oracle")


def _top_dir(item: pytest.Item) -> str:
    return Path(str(item.path)).relative_to(Path(__file__).parent).parts[0]


def _interleaved(items: list[pytest.Item]) -> list[pytest.Item]:
    files: dict[Path, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(Path(str(item.path)), []).append(item)
    # Spark's files first: they are the longest.
    heavy = sorted(
        (f for f in files if _top_dir(files[f][0]) in _JVM_DIRS),
        key=lambda f: _JVM_DIRS.index(_top_dir(files[f][0])),
    )
    light = [f for f in files if _top_dir(files[f][0]) not in _JVM_DIRS]
    order: list[Path] = []
    step = max(1, len(light) // max(1, len(heavy)))
    for i, f in enumerate(heavy):
        order.append(f)
        order += light[i * step : (i + 1) * step]
    order += light[len(heavy) * step :]
    return [item for f in order for item in files[f]]


# The files that share a JVM fixture built once per test process besides the Kafka node of
# the differential files: Spark's session and broker (tests/spark) and the 3-node Kafka cluster.
# xdist sends them to one worker as one unit, so those JVMs start once per run, not once per
# worker; the unit starts first (Spark's files lead the order above).
_CLUSTER_FILES = frozenset(
    {
        "tests/interop/test_consumer_position_validation.py",
        "tests/oracle/test_kafka_cluster_faults.py",
        "tests/oracle/test_kafka_cluster_validation.py",
        "tests/oracle/test_kafka_launcher.py",
    }
)


def _shared_jvm_unit(path: str) -> bool:
    return path.startswith("tests/spark/") or path in _CLUSTER_FILES


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadFileScheduling

    if config.getoption("dist") != "loadfile":
        return None

    class SharedJvmsInOneUnit(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "shared JVMs" if _shared_jvm_unit(path) else path

    return SharedJvmsInOneUnit(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = _interleaved(items)
    for item in items:
        if _uses_brokers(item):
            item.add_marker(pytest.mark.brokers)
        path = Path(str(item.path)).relative_to(config.rootpath).as_posix()
        if "_kafka_cluster" in getattr(item, "fixturenames", ()) and not _shared_jvm_unit(path):
            raise pytest.UsageError(f"{path} uses the Kafka cluster: list it in _CLUSTER_FILES")


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[type[BrokerProcess]]:
    started: list[BrokerProcess] = []

    class Factory(BrokerProcess):
        def __init__(self, data_dir: Path | None = None, overrides: dict[str, str] | None = None):
            super().__init__(data_dir or tmp_path / f"data{len(started)}", overrides)
            started.append(self)

    yield Factory
    for b in started:
        b.stop()


@pytest.fixture
def broker(broker_factory: type[BrokerProcess]) -> BrokerProcess:
    return broker_factory().start()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("shared")).start()
    yield b
    b.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def _kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(
        tmp_path_factory.mktemp("kafka-cluster"),
        overrides=FAST_FAILOVER,
    ).start(timeout=300)  # JVMs start slowly on a loaded machine
    yield cluster
    cluster.stop()


@pytest.fixture
def kafka_cluster(_kafka_cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """Three KRaft nodes with fast failure detection, one cluster per test process (three
    JVMs start in tens of seconds): each test names its own topics, groups and
    transactional ids, and whatever nodes it kills or pauses are serving again after it."""
    yield _kafka_cluster
    for node in _kafka_cluster.nodes:
        if node.alive():
            node.resume()  # a no-op unless the test left it stopped
    _kafka_cluster.wait_all()


@pytest.fixture(scope="session")
def tansu() -> Iterator[str]:
    """The reference broker Tansu (memory engine) on a free port of 127.0.0.1. Its absence
    or a failed start fails the tests that use it: they are comparisons, not optional."""
    port = _free_port()
    proc = subprocess.Popen(
        tansu_broker_args(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"tansu did not start (exit code {proc.poll()})")
                time.sleep(0.3)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The differential scenarios' counts (tests/oracle/test_differential_*). Here, not in
    tests/oracle's conftest, because pytest-xdist's controller loads only this one."""
    lines = summary_lines(r for reports in terminalreporter.stats.values() for r in reports)
    if lines:
        terminalreporter.section("differential conformance (samsa vs Apache Kafka)")
        for line in lines:
            terminalreporter.write_line(line)
