"""Spark tests share ONE local SparkSession (startup takes 10-30 s) and one broker."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:
    # Not an optional feature: `make test` installs the spark extra, so this is a broken
    # install, and skipping would hide it.
    raise ImportError(f"{exc}: the Spark tests need the 'spark' extra (make test)") from exc

from _broker import BrokerProcess
from samsa.client import Admin, ConsumerRecord
from samsa.testing import read_topic as read_whole_topic

_names = itertools.count()


@pytest.fixture(scope="session")
def spark_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("spark-broker")).start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import samsa.spark

    # local[2,4]: two cores, a failed task is tried up to 4 times (retries are under test)
    session = samsa.spark.local_session("local[2,4]", "samsa-tests")
    yield session
    session.stop()


@pytest.fixture
def bootstrap(spark_broker: BrokerProcess) -> str:
    return spark_broker.bootstrap


@pytest.fixture
def new_topic(bootstrap: str) -> Callable[..., str]:
    """Create a fresh topic: new_topic(partitions=1, prefix="t") -> name."""

    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{next(_names)}"
        with Admin({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topic(name, partitions)
        return name

    return make


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoint")


@pytest.fixture
def read_topic(bootstrap: str) -> Callable[..., list[ConsumerRecord]]:
    """read_topic(topic, committed=True): every record of ``topic`` up to its current end."""

    def read(topic: str, *, committed: bool = True) -> list[ConsumerRecord]:
        return read_whole_topic(bootstrap, topic, committed=committed, timeout=10.0)

    return read
