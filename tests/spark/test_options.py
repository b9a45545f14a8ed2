"""Option parsing, offsets JSON and admission control: no SparkSession needed."""

from __future__ import annotations

import pytest

from samsa.client import TopicPartition
from samsa.spark._options import (
    SinkOptions,
    SourceOptions,
    SparkOptionError,
    offsets_from_json,
    offsets_to_json,
)
from samsa.spark._read import OffsetRange, rate_limit, split_ranges
from samsa.spark._write import validate_columns

BS = {"kafka.bootstrap.servers": "127.0.0.1:1"}


def parse(streaming: bool = False, **opts: str) -> SourceOptions:
    return SourceOptions.parse({**BS, **opts}, streaming=streaming)


def test_defaults_follow_sparks_kafka_source() -> None:
    batch = parse(subscribe="a,b")
    assert batch.subscription.topics == ("a", "b")
    assert batch.starting == "earliest" and batch.ending == "latest"
    assert batch.isolation_level == "read_committed"
    assert batch.fail_on_data_loss and not batch.include_headers
    stream = parse(True, subscribePattern="pay.*", maxOffsetsPerTrigger="10")
    assert stream.starting == "latest" and stream.max_offsets_per_trigger == 10


def test_option_names_are_case_insensitive() -> None:
    o = SourceOptions.parse(
        {"KAFKA.BOOTSTRAP.SERVERS": "127.0.0.1:1", "Subscribe": "t", "INCLUDEHEADERS": "true"},
        streaming=False,
    )
    assert o.include_headers and o.subscription.topics == ("t",)


@pytest.mark.parametrize(
    ("opts", "streaming", "message"),
    [
        ({"subscribe": "t", "kafka.bootstrap.servers": ""}, False, "kafka.bootstrap.servers"),
        ({}, False, "exactly one of the options subscribe"),
        ({"subscribe": "a", "assign": '{"a":[0]}'}, False, "found: subscribe, assign"),
        ({"assign": "[1,2]"}, False, "option assign must be a JSON object"),
        ({"assign": '{"a":[-1]}'}, False, "non-negative"),
        ({"subscribePattern": "("}, False, "not a valid regex"),
        ({"subscribe": "t", "startingOffsets": "latest"}, False, "cannot be latest"),
        ({"subscribe": "t", "endingOffsets": "earliest"}, False, "cannot be earliest"),
        ({"subscribe": "t", "startingOffsets": "{nope"}, False, "must be earliest, latest or JSON"),
        ({"subscribe": "t", "startingOffsets": '{"t":{"0":-1}}'}, False, "-1 (latest)"),
        ({"subscribe": "t", "endingOffsets": '{"t":{"0":-2}}'}, False, "-2 (earliest)"),
        ({"subscribe": "t", "endingOffsets": "latest"}, True, "batch queries only"),
        ({"subscribe": "t", "maxOffsetsPerTrigger": "5"}, False, "streaming queries only"),
        ({"subscribe": "t", "maxOffsetsPerTrigger": "0"}, True, "positive integer"),
        ({"subscribe": "t", "failOnDataLoss": "maybe"}, False, "true or false"),
        ({"subscribe": "t", "kafka.isolation.level": "dirty"}, False, "read_committed or"),
        ({"subscribe": "t", "kafka.group.id": "g"}, False, "not supported"),
        ({"subscribe": "t", "kafka.no.such.thing": "1"}, False, "not a samsa consumer setting"),
    ],
)
def test_bad_source_options_are_named(opts: dict[str, str], streaming: bool, message: str) -> None:
    base = {} if "kafka.bootstrap.servers" in opts else BS
    with pytest.raises(SparkOptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SourceOptions.parse({**base, **opts}, streaming=streaming)


def test_offsets_json_is_canonical() -> None:
    offsets = {
        TopicPartition("b", 10): 5,
        TopicPartition("b", 2): 7,
        TopicPartition("a", 0): 1,
    }
    doc = offsets_to_json(offsets)
    assert list(doc) == ["a", "b"] and list(doc["b"]) == ["2", "10"]
    assert offsets_from_json(doc) == offsets
    spec = parse(startingOffsets='{"t":{"0":23,"1":-2}}', subscribe="t").starting
    assert spec == {TopicPartition("t", 0): 23, TopicPartition("t", 1): -2}


def test_rate_limit_shares_in_proportion_and_never_exceeds() -> None:
    a, b, c = (TopicPartition("t", i) for i in range(3))
    start = {a: 0, b: 100, c: 50}
    end = {a: 300, b: 200, c: 50}
    limited = rate_limit(start, end, 100)
    assert sum(limited[tp] - start[tp] for tp in end) == 100
    assert limited[a] - start[a] == 75 and limited[b] - start[b] == 25 and limited[c] == 50
    assert rate_limit(start, end, 10_000) == end
    odd = rate_limit({a: 0, b: 0, c: 0}, {a: 1, b: 1, c: 1}, 2)
    assert sum(odd.values()) == 2 and all(v <= 1 for v in odd.values())


def test_min_partitions_splits_ranges() -> None:
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 10)]
    split = split_ranges(ranges, 5)
    assert len(split) >= 5
    assert sum(r.size for r in split) == 110
    assert split_ranges(ranges, None) == ranges


def test_sink_options_and_columns() -> None:
    o = SinkOptions.parse({**BS, "checkpointLocation": "/c"}, streaming=True, job_id="x")
    again = SinkOptions.parse({**BS, "checkpointlocation": "/c"}, streaming=True, job_id="y")
    assert o.stable_prefix and o.transactional_id_prefix == again.transactional_id_prefix
    other = SinkOptions.parse({**BS, "checkpointLocation": "/d"}, streaming=True, job_id="x")
    assert other.transactional_id_prefix != o.transactional_id_prefix
    batch = SinkOptions.parse({**BS, "topic": "t"}, streaming=False, job_id="j1")
    assert batch.transactional_id_prefix.endswith("j1") and batch.exactly_once
    with pytest.raises(SparkOptionError, match=r"kafka\.transactional\.id"):
        SinkOptions.parse({**BS, "kafka.transactional.id": "x"}, streaming=True, job_id="j")
    with pytest.raises(SparkOptionError, match="PARTITION:RECORDS"):
        SinkOptions.parse({**BS, "injectTaskFailure": "x"}, streaming=True, job_id="j")
    validate_columns(["value"], {"value": "string"}, batch)
    with pytest.raises(SparkOptionError, match="required attribute 'value'"):
        validate_columns(["key"], {"key": "string"}, batch)
    no_topic = SinkOptions.parse(BS, streaming=False, job_id="j")
    with pytest.raises(SparkOptionError, match="topic option required"):
        validate_columns(["value"], {"value": "binary"}, no_topic)
    with pytest.raises(SparkOptionError, match="key attribute type"):
        validate_columns(["value", "key"], {"value": "binary", "key": "int"}, batch)


def test_security_options_under_the_jvm_clients_names() -> None:
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="ann" password="p\\"w";'
    )
    o = parse(
        subscribe="t",
        **{
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": jaas,
            "kafka.ssl.truststore.location": "/ca.pem",
            "kafka.ssl.truststore.type": "PEM",
        },
    )
    assert {k: o.client[k] for k in o.client if k.startswith(("sasl.", "ssl.", "security."))} == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "ann",
        "sasl.password": 'p"w',
        "ssl.ca.location": "/ca.pem",
    }
    with pytest.raises(SparkOptionError, match="ScramLoginModule"):
        parse(subscribe="t", **{"kafka.sasl.jaas.config": "Krb5LoginModule required;"})
    with pytest.raises(SparkOptionError, match="PEM only"):
        parse(subscribe="t", **{"kafka.ssl.truststore.type": "JKS"})
