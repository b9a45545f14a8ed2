"""Request and response (de)serialisation through kio's generated Kafka schemas.

kio has one dataclass per (API, version), generated from Kafka's JSON message definitions,
with a native reader. This module looks the classes up once per (API, version) and caches
the reader and writer. The hot responses (Produce, Fetch) are encoded in
:mod:`samsa.protocol.hotpath` instead; everything else goes through here.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import sys
import typing
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer

from samsa.protocol.framing import FrameError


class ApiKey:
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    UPDATE_FEATURES = 57
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    GET_TELEMETRY_SUBSCRIPTIONS = 71
    PUSH_TELEMETRY = 72
    LIST_CONFIG_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92


def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, f"api-{api_key}")


@cache
def request_class(api_key: int, version: int) -> type[Any]:
    return load_request_schema(api_key, version)


@cache
def response_class(api_key: int, version: int) -> type[Any]:
    return load_response_schema(api_key, version)


@cache
def is_flexible(api_key: int, version: int) -> bool:
    return bool(request_class(api_key, version).__flexible__)


@cache
def _reader(api_key: int, version: int) -> Any:
    return entity_reader(request_class(api_key, version))


@cache
def _request_writer(api_key: int, version: int) -> Any:
    return entity_writer(request_class(api_key, version))


@cache
def _response_writer(api_key: int, version: int) -> Any:
    return entity_writer(response_class(api_key, version))


@cache
def _response_reader(api_key: int, version: int) -> Any:
    if api_key == ApiKey.DESCRIBE_TRANSACTIONS and version == 0:
        return entity_reader(_lenient_describe_transactions_v0())
    return entity_reader(response_class(api_key, version))


@cache
def _lenient_describe_transactions_v0() -> type[Any]:
    """DescribeTransactions v0's response with a start time that may be unset.

    Kafka sends ``transaction_start_time_ms`` -1 for a transactional id with no transaction
    open (Empty, CompleteCommit, ...), but kio types the field as a timestamp and refuses to
    read a negative one, so a describe of any idle id failed to decode. This subclass types
    the same field as nullable: -1 reads as None, the other fields and their order unchanged.
    """
    from kio.schema.describe_transactions.v0 import response as schema
    from kio.static.primitive import TZAware

    # make_dataclass, not a class statement: kio reads the field types, which this module's
    # `from __future__ import annotations` would turn into strings.
    options: dict[str, Any] = {"frozen": True, "slots": True, "kw_only": True}
    state = dataclasses.make_dataclass(
        "TransactionState",
        [
            (
                "transaction_start_time",
                TZAware | None,
                dataclasses.field(metadata={"kafka_type": "datetime_i64"}),
            )
        ],
        bases=(schema.TransactionState,),
        **options,
    )
    DescribeTransactionsResponse = dataclasses.make_dataclass(
        "DescribeTransactionsResponse",
        [("transaction_states", tuple[state, ...])],  # type: ignore[valid-type]
        bases=(schema.DescribeTransactionsResponse,),
        **options,
    )
    return DescribeTransactionsResponse


def decode_request(api_key: int, version: int, frame: bytes, offset: int) -> Any:
    """The kio request entity in ``frame[offset:]``; a malformed body is a FrameError."""
    try:
        entity, _size = _reader(api_key, version)(frame, offset)
    except Exception as exc:  # kio raises several types for malformed input
        raise FrameError(f"malformed {api_name(api_key)} v{version} request: {exc}") from exc
    problem = _null_in_non_nullable(entity)
    if problem is not None:
        raise FrameError(f"malformed {api_name(api_key)} v{version} request: {problem} is null")
    # Bytes after the body are ignored, as Kafka does (it never checks for them).
    # librdkafka relies on it: its all-topics Metadata v9+ request keeps a 4-byte
    # placeholder where the compact array length (one varint byte) belongs, so the body
    # ends with 3 extra bytes.
    return entity


def _null_in_non_nullable(entity: Any) -> str | None:
    """kio reads a length of -1 as None even where the schema does not allow null (Kafka
    rejects such a request); find the first such field so handlers never see one."""
    for name, nullable, nested in _checked_fields(type(entity)):
        value = getattr(entity, name)
        if value is None:
            if nullable:
                continue
            return name
        if nested:
            for item in value if isinstance(value, tuple) else (value,):
                problem = _null_in_non_nullable(item)
                if problem is not None:
                    return f"{name}.{problem}"
    return None


@cache
def _checked_fields(cls: type[Any]) -> tuple[tuple[str, bool, bool], ...]:
    """(name, nullable, holds entities) of the fields worth checking: the non-nullable ones
    and those holding nested entities."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        nullable = type(None) in args
        types = [a for a in args if a is not type(None)] if nullable else [hint]
        nested = any(
            dataclasses.is_dataclass(typing.get_args(t)[0] if typing.get_origin(t) is tuple else t)
            for t in types
        )
        if not nullable or nested:
            out.append((f.name, nullable, nested))
    return tuple(out)


def encode_response(api_key: int, version: int, entity: Any) -> bytes:
    buf = io.BytesIO()
    _response_writer(api_key, version)(buf, entity)
    return buf.getvalue()


def encode_request(api_key: int, version: int, entity: Any) -> bytes:
    buf = io.BytesIO()
    _request_writer(api_key, version)(buf, entity)
    return buf.getvalue()


def decode_response(api_key: int, version: int, frame: bytes, offset: int) -> Any:
    entity, _size = _response_reader(api_key, version)(frame, offset)
    return entity


def entity_module(api_key: int, version: int, response: bool = True) -> Any:
    cls = response_class(api_key, version) if response else request_class(api_key, version)
    return sys.modules[cls.__module__]


def make(api_key: int, version: int, class_name: str, /, **values: Any) -> Any:
    """Build kio entity ``class_name`` of (api_key, version)'s response schema.

    Values for fields this version does not have are dropped, so one handler serves every
    version; plain ints are converted for error-code and duration fields.
    """
    cls = getattr(entity_module(api_key, version), class_name)
    return _construct(cls, values)


def make_request(api_key: int, version: int, class_name: str, /, **values: Any) -> Any:
    cls = getattr(entity_module(api_key, version, response=False), class_name)
    return _construct(cls, values)


def _construct(cls: type[Any], values: dict[str, Any]) -> Any:
    kinds = _field_kinds(cls)
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        kind = kinds.get(name)
        if kind is None and name not in kinds:
            continue
        if kind == "error_code" and not isinstance(value, KioErrorCode):
            value = KioErrorCode(int(value))
        elif kind in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
            value = datetime.timedelta(milliseconds=value)
        kwargs[name] = value
    return cls(**kwargs)


@cache
def _field_kinds(cls: type[Any]) -> dict[str, str | None]:
    return {f.name: f.metadata.get("kafka_type") for f in dataclasses.fields(cls)}
