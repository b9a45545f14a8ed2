"""protocol/_records.c's record walker against the numpy path it speeds up, on arbitrary
records: valid ones (with varints of every size Java reads, five-byte ints whose high bits
Java drops included) and the same bytes corrupted (bytes changed, cut out, added, the batch
cut short, a record count declared wrong), fed whole or cut into chunks anywhere, under a
topic's rules (keys required, a timestamp window). Both paths refuse the same batches with
the same error code, and accept the others with the same summary: count, record errors and
their messages, the batch's error."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samsa.protocol.record_check import RecordChecker, RecordRules
from samsa.protocol.records import InvalidBatchError, RecordBatchView

BASE_TS = 1_700_000_000_000

pytestmark = pytest.mark.skipif(
    RecordChecker.walk is None, reason="samsa.protocol._records was not built"
)


class _NumpyChecker(RecordChecker):
    walk = None


def _varint(value: int, bits: int, style: int) -> bytes:
    """``value`` zigzag-encoded as Java writes it (``style`` 0 or 1), in more bytes than
    needed (2), or also with high bits a five-byte int's last byte carries and Java drops
    (3)."""
    raw = ((value << 1) ^ (value >> (bits - 1))) & ((1 << bits) - 1)
    most = 5 if bits == 32 else 10
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    if style >= 2 and len(out) < most:
        out[-1] |= 0x80
        out += b"\x80" * (most - len(out) - 1) + (b"\x70" if style == 3 and bits == 32 else b"\x00")
    return bytes(out)


_BLOB = st.binary(max_size=12)
_TS_DELTA = st.one_of(st.integers(-1000, 1000), st.integers(-(2**63), 2**63 - 1))
_KEY = st.one_of(st.none(), _BLOB)
_VALUE = st.one_of(st.none(), _BLOB, st.binary(min_size=100, max_size=300))
_HEADERS = st.lists(st.tuples(_BLOB, st.one_of(st.none(), _BLOB)), max_size=3)
# two bits a varint, in order: the style of each (mostly all of them Java's own)
_STYLES = st.one_of(st.just(0), st.integers(0, 2**40 - 1))
_BYTE = st.integers(0, 255)


# A field of one record made wrong as a client could: each a refusal Kafka answers.
_FAULTS = st.sampled_from(
    [
        "offset delta",
        "key past the record",
        "value past the record",
        "negative header count",
        "more headers than bytes",
        "negative header key length",
        "header value past the record",
        "length too long",
        "length too short",
        "length under six",
    ]
)


@st.composite
def _record(draw: st.DrawFn, index: int, fault: str | None) -> bytes:
    ts_delta, key, value = draw(_TS_DELTA), draw(_KEY), draw(_VALUE)
    headers = draw(_HEADERS)
    odd = draw(_STYLES)

    def v(value: int, bits: int = 32) -> bytes:
        nonlocal odd
        style, odd = odd & 3, odd >> 2
        return _varint(value, bits, style)

    def sized(b: bytes | None, past: bool = False) -> bytes:
        if b is None:
            return v(-1)
        return v(len(b) + 40 if past else len(b)) + b

    if fault in ("negative header key length", "header value past the record") and not headers:
        headers = [(b"h", b"x")]
    count = {"negative header count": -2, "more headers than bytes": len(headers) + 40}
    body = bytes([draw(_BYTE)]) + v(ts_delta, 64)
    body += v(index + 1 if fault == "offset delta" else index)
    body += sized(key or b"", fault == "key past the record") if fault else sized(key)
    body += sized(value or b"", fault == "value past the record") if fault else sized(value)
    body += v(count.get(fault or "", len(headers)))
    for i, (hk, hv) in enumerate(headers):
        if i == 0 and fault == "negative header key length":
            body += v(-1)
        else:
            body += v(len(hk)) + hk
        body += sized(hv or b"", fault == "header value past the record" and i == 0)
    length = len(body) + {"length too long": 1, "length too short": -1}.get(fault or "", 0)
    if fault == "length under six":
        length = draw(st.integers(-3, 5))
    return v(length) + body


_CORRUPTIONS = st.lists(
    st.tuples(st.sampled_from(["set", "delete", "insert"]), st.integers(0, 1 << 16), _BYTE),
    max_size=3,
)
_CUT_SHORT = st.one_of(st.just(None), st.integers(0, 1 << 16))  # mostly whole
_MISCOUNT = st.sampled_from([0] * 8 + [-1, 1])


@st.composite
def _records_section(draw: st.DrawFn) -> tuple[bytes, int]:
    """Records (then, half the time, corrupted), and the count the batch declares."""
    n = draw(st.integers(1, 12))
    faulty, fault = draw(st.integers(0, 3 * n)), draw(_FAULTS)  # a third of them well formed
    body = bytearray(b"".join(draw(_record(i, fault if i == faulty else None)) for i in range(n)))
    for op, at, byte in draw(_CORRUPTIONS) if draw(st.booleans()) else ():
        at %= len(body) + 1
        if op == "set" and at < len(body):
            body[at] = byte
        elif op == "delete":
            del body[at : at + 1 + byte % 4]
        elif op == "insert":
            body[at:at] = bytes([byte])
    cut = draw(_CUT_SHORT)
    if cut is not None and draw(st.integers(0, 4)) == 0:
        del body[cut % (len(body) + 1) :]
    return bytes(body), n + draw(_MISCOUNT)


def _view(body: bytes, count: int) -> RecordBatchView:
    after = struct.pack(">hiqqqhii", 0, count - 1, BASE_TS, BASE_TS, -1, -1, -1, count) + body
    head = struct.pack(">qiibI", 0, len(after) + 9, 0, 2, crc32c.crc32c(after))
    return RecordBatchView(head + after)


def _verdict(
    checker_class: type[RecordChecker], view: RecordBatchView, rules: RecordRules, cuts: list[int]
) -> tuple[Any, ...]:
    body = bytes(view.buf[61:])
    checker = checker_class(view, rules)
    try:
        if not cuts and checker.walk is not None:  # as check_records reads a plain batch
            checker.read_in_place(view.buf, 61, len(view.buf))
        else:  # as an inflated stream comes, in chunks
            last = 0
            for cut in [*sorted(c % (len(body) + 1) for c in cuts), len(body)]:
                checker.feed(body[last:cut])
                last = max(last, cut)
        s = checker.finish()
    except InvalidBatchError as exc:
        return ("refused", exc.code)
    return ("accepted", s.count, s.inflated_bytes, s.error_count, s.error, s.record_errors)


_rules = st.builds(
    RecordRules,
    need_key=st.booleans(),
    partition=st.just("t-0"),
    min_timestamp=st.one_of(st.none(), st.integers(BASE_TS - 2000, BASE_TS)),
    max_timestamp=st.one_of(st.none(), st.integers(BASE_TS, BASE_TS + 2000)),
)


@settings(max_examples=200, deadline=None)
@given(
    section=_records_section(),
    rules=_rules,
    cuts=st.lists(st.integers(0, 10_000), max_size=3),
)
def test_the_c_walker_and_numpy_give_the_same_verdicts(
    section: tuple[bytes, int], rules: RecordRules, cuts: list[int]
) -> None:
    body, declared = section
    view = _view(body, declared)
    assert _verdict(RecordChecker, view, rules, cuts) == _verdict(_NumpyChecker, view, rules, cuts)
