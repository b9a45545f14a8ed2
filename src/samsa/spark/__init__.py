"""samsa on Spark: a PySpark (4.x) Python data source named ``samsa``.

Reads and writes with the option names and row schema of Spark's Kafka connector
(``kafka.bootstrap.servers``, ``subscribe``/``subscribePattern``/``assign``,
``startingOffsets``/``endingOffsets``, ``maxOffsetsPerTrigger``, ``kafka.isolation.level``,
``failOnDataLoss``, ``includeHeaders``; ``topic`` option or column, ``key``, ``value``,
``partition``, ``headers`` columns), and writes exactly once (see
:mod:`samsa.spark._write`). Secured listeners take ``kafka.security.protocol``,
``kafka.sasl.mechanism`` and ``kafka.sasl.jaas.config`` (PLAIN or SCRAM login module) or
``kafka.sasl.username``/``kafka.sasl.password``, and a PEM ``kafka.ssl.truststore.location``
(or ``kafka.ssl.ca.location``)::

    import samsa.spark
    samsa.spark.register(spark)
    df = spark.readStream.format("samsa").option("kafka.bootstrap.servers", "127.0.0.1:9092") \\
        .option("subscribe", "payments").load()

This package is the only part of samsa that imports pyspark; import it only where Spark is
installed (the ``spark`` extra).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

from samsa.spark._options import SinkOptions, SourceOptions, SparkOptionError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SinkOptions", "SourceOptions", "SparkOptionError", "local_session", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``samsa`` format with ``spark``."""
    from samsa.spark.source import SamsaDataSource

    spark.dataSource.register(SamsaDataSource)


def local_session(
    master: str = "local[2]",
    app_name: str = "samsa",
    conf: dict[str, Any] | None = None,
    log_level: str = "ERROR",
) -> SparkSession:
    """A quiet local SparkSession (127.0.0.1 only) whose Python workers run this
    interpreter, with ``samsa`` registered; ``conf`` adds Spark settings."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark
