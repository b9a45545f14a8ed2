"""samsa's CLI takes Kafka's spellings: the action flags of kafka-topics,
kafka-consumer-groups and kafka-acls, ``--topic``/``--group``/``--transactional-id`` for the
names, and the console producer's and consumer's ``--property`` keys, which read and print
lines as Kafka's LineMessageReader and DefaultMessageFormatter do (tests/oracle compares
them with Kafka's own tools)."""

from __future__ import annotations

import argparse

import pytest

from samsa.cli import build_parser, kafka_style
from samsa.cli._names import missing_names
from samsa.cli.consume import Formatter
from samsa.cli.produce import LineReader
from samsa.client import ConsumerRecord


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(kafka_style(list(argv)))


def test_action_flags_become_samsa_words() -> None:
    assert kafka_style(["topics", "--bootstrap-server", "h:1", "--create", "--topic", "t"]) == [
        "topics", "create", "--bootstrap-server", "h:1", "--topic", "t",
    ]  # fmt: skip
    assert kafka_style(["-v", "groups", "--describe", "--group", "g"])[:3] == [
        "-v", "groups", "describe",
    ]  # fmt: skip
    assert kafka_style(["acls", "--list", "--topic", "t"])[:2] == ["acls", "list"]
    # samsa's own spelling, other commands and two actions at once are left alone
    assert kafka_style(["topics", "list"]) == ["topics", "list"]
    assert kafka_style(["configs", "--describe"]) == ["configs", "--describe"]
    two = ["topics", "--create", "--delete", "--topic", "t"]
    assert kafka_style(two) == two


def test_names_by_position_or_by_kafkas_flag() -> None:
    for argv in (["topics", "create", "orders"], ["topics", "--create", "--topic", "orders"]):
        args = _parse(*argv, "--partitions", "3", "--replication-factor", "1",
                      "--config", "retention.ms=1")  # fmt: skip
        assert (args.action, args.topic, args.partitions, args.config) == (
            "create", "orders", 3, ["retention.ms=1"],
        )  # fmt: skip
        assert missing_names(args) == []
    assert _parse("topics", "--delete", "--topic", "a", "--topic", "b").topic == ["a", "b"]
    assert _parse("topics", "delete", "a", "b").topic == ["a", "b"]
    assert _parse("topics", "--describe").topic == []
    assert missing_names(_parse("topics", "--create")) == ["TOPIC (or --topic)"]
    assert missing_names(_parse("topics", "delete")) == ["TOPIC (or --topic)"]
    described = _parse("groups", "--describe", "--group", "g", "--members", "--verbose")
    assert (described.action, described.group, described.members) == ("describe", "g", True)
    assert _parse("groups", "--list", "--state").state == [""]
    assert _parse("transactions", "describe", "--transactional-id", "tx").transactional_id == "tx"
    producers = _parse("transactions", "describe-producers", "--topic", "t", "--partition", "0")
    assert (producers.topic, producers.partition) == ("t", 0)
    assert producers.func is _parse("producers", "t").func
    reset = _parse("groups", "--reset-offsets", "--group", "g", "--topic", "t:0", "--to-earliest")
    assert (reset.action, reset.group, reset.topic, reset.to_earliest) == (
        "reset-offsets", "g", ["t:0"], True,
    )  # fmt: skip
    consume = _parse("consume", "--topic", "t", "--offset", "earliest",
                     "--consumer-property", "fetch.max.bytes=1024")  # fmt: skip
    assert (consume.topic, consume.offset) == ("t", "earliest")
    with pytest.raises(SystemExit):
        _parse("consume", "--topic", "t", "--offset", "soon")


def test_line_reader_parses_as_kafkas_console_producer() -> None:
    props = {"parse.key": "true", "key.separator": ":", "parse.headers": "true",
             "null.marker": "NULL"}  # fmt: skip
    reader = LineReader(props, None)
    assert reader.parse(b"h1:x,h2:NULL\tk1:v:1", 1) == (
        b"k1", b"v:1", [("h1", b"x"), ("h2", None)],
    )  # fmt: skip
    assert reader.parse(b"NULL\tNULL:NULL", 2) == (None, None, [])
    with pytest.raises(ValueError, match="No headers delimiter found on line number 3"):
        reader.parse(b"k:v", 3)
    with pytest.raises(ValueError, match="No header key separator found in pair b'h1'"):
        reader.parse(b"h1\tk:v", 4)
    with pytest.raises(ValueError, match="No key separator found on line number 5"):
        reader.parse(b"h:1\tkv", 5)
    plain = LineReader({}, None)
    assert plain.parse(b"a\tb", 1) == (None, b"a\tb", [])
    assert LineReader({}, "=").parse(b"k=v", 1) == (b"k", b"v", [])  # samsa's --key-separator


def test_formatter_prints_as_kafkas_console_consumer() -> None:
    args = argparse.Namespace(print_key=False, key_separator=None)
    every = {"print.timestamp": "true", "print.partition": "true", "print.offset": "true",
             "print.headers": "true", "print.key": "true"}  # fmt: skip
    record = ConsumerRecord("t", 1, 7, 1_700_000_000_000, b"k", b"v", (("a", b"1"), ("b", None)))
    assert Formatter(every, args).format(record) == (
        b"CreateTime:1700000000000\tPartition:1\tOffset:7\ta:1,b:null\tk\tv\n"
    )
    bare = ConsumerRecord("t", 0, 0, 0, None, None, timestamp_type=1)
    assert Formatter(every, args).format(bare) == (
        b"LogAppendTime:0\tPartition:0\tOffset:0\tNO_HEADERS\tnull\tnull\n"
    )
    assert Formatter({}, args).format(record) == b"v\n"
    # samsa's own --print-key / --key-separator still work
    mine = argparse.Namespace(print_key=True, key_separator="=")
    assert Formatter({}, mine).format(record) == b"k=v\n"
