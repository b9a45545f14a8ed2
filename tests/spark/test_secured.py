"""The Spark sink and source over a SASL_SSL listener (SCRAM-SHA-256), configured as Spark's
Kafka connector is: ``kafka.security.protocol``, ``kafka.sasl.mechanism``,
``kafka.sasl.jaas.config`` and a PEM ``kafka.ssl.truststore.location``."""

from __future__ import annotations

import collections
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from _broker import BrokerProcess
from _certs import Pki, make_pki
from samsa.client import Admin

pytestmark = pytest.mark.timeout(120)
PASSWORD = "spark-secret"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Pki]]:
    root = tmp_path_factory.mktemp("spark-secured")
    pki = make_pki(root / "pki")
    data = root / "data"
    add = ["users", "add", "spark", "--password", PASSWORD, "--mechanism", "SCRAM-SHA-256"]
    added = subprocess.run(
        [sys.executable, "-m", "samsa", *add, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    broker = BrokerProcess(
        data,
        {
            "listeners": "SASL_SSL://127.0.0.1:0",  # nothing else to come in by
            "ssl.keystore.location": str(pki.broker),
            "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        },
    ).start()
    yield broker, pki
    broker.stop()


def _spark_options(broker: BrokerProcess, pki: Pki) -> dict[str, str]:
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="spark" password="{PASSWORD}";'
    )
    return {
        "kafka.bootstrap.servers": broker.bootstrap,
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-256",
        "kafka.sasl.jaas.config": jaas,
        "kafka.ssl.truststore.location": str(pki.ca),
        "kafka.ssl.truststore.type": "PEM",
    }


def test_sink_and_source_over_sasl_ssl_exactly_once(
    spark: Any, secured: tuple[BrokerProcess, Pki]
) -> None:
    broker, pki = secured
    client = {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "spark",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(pki.ca),
    }
    with Admin(client) as admin:
        admin.create_topic("secured", 2)
    options = _spark_options(broker, pki)

    df = spark.range(0, 200, numPartitions=2).selectExpr("CAST(id AS STRING) AS value")
    df.write.format("samsa").options(**options).option("topic", "secured").mode("append").save()

    rows = spark.read.format("samsa").options(**options).option("subscribe", "secured").load()
    got = collections.Counter(bytes(r.value) for r in rows.select("value").collect())
    assert got == collections.Counter(b"%d" % i for i in range(200))
