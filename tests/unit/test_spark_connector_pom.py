"""kafka/spark-connector/pom.xml (Spark's Kafka connector, the peer of benchmarks/
spark_connector.py) adds to pyspark only the jars pyspark lacks: a second copy of a jar
pyspark ships (Scala, Hadoop's client, lz4, ...) in another version would clash on the
session's classpath."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

POM = Path(__file__).resolve().parents[2] / "kafka" / "spark-connector" / "pom.xml"
NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def pyspark_jars() -> set[str]:
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.submodule_search_locations
    return {p.name for p in (Path(spec.submodule_search_locations[0]) / "jars").glob("*.jar")}


def dependencies() -> list[ET.Element]:
    return ET.parse(POM).getroot().findall("m:dependencies/m:dependency", NS)


def artifact(dep: ET.Element) -> str:
    return dep.findtext("m:artifactId", namespaces=NS) or ""


def test_the_connector_and_kafka_clients_are_kept_and_pyspark_ships_neither() -> None:
    shipped = pyspark_jars()
    assert any(j.startswith("spark-core_2.13-") for j in shipped)  # the jars were found
    kept = [artifact(d) for d in dependencies()]
    assert {"spark-sql-kafka-0-10_2.13", "kafka-clients"} <= set(kept)
    for name in kept:
        assert not any(j.startswith(f"{name}-") for j in shipped), name


def test_what_the_connector_pulls_in_is_excluded() -> None:
    # the connector, its token provider and kafka-clients depend on Scala, Hadoop's client,
    # spark-tags, lz4, snappy and slf4j, all of which pyspark ships
    for dep in dependencies():
        if artifact(dep) == "commons-pool2":  # no dependencies of its own
            continue
        excluded = {
            (e.findtext("m:groupId", namespaces=NS), e.findtext("m:artifactId", namespaces=NS))
            for e in dep.findall("m:exclusions/m:exclusion", NS)
        }
        assert ("*", "*") in excluded, artifact(dep)
