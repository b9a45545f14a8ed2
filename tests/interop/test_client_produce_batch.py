"""Producer.produce_batch / AsyncProducer.produce_batch against a samsa broker.

* one future per call resolves with where every record landed (runs of offsets per
  partition), and the log holds the call's rows, in call order per partition;
* keys land where Java's partitioner puts them; unkeyed rows move on every batch.size (sticky
  per batch), so a large unkeyed burst spreads over the partitions;
* produce() and produce_batch() records keep their order in one partition;
* a bad column raises in the call and queues nothing; a partition the topic lacks fails only
  those rows; a large call is bounded by buffer.memory;
* in a transaction, the rows are visible after commit and never after abort;
* batches grow past batch.size up to the topic's max.message.bytes and max.request.size.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pyarrow as pa
import pytest

from samsa.client import (
    Admin,
    AsyncProducer,
    BatchMetadata,
    KafkaError,
    Producer,
    partition_for_key,
)
from samsa.testing import read_topic


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"pbatch-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, partitions)
    return name


def test_one_future_per_call_with_offsets_and_rows_in_order(shared_broker: Any) -> None:
    bs = shared_broker.bootstrap
    topic = _topic(bs, 3)
    n = 5000
    values = pa.array([b"v%05d" % i for i in range(n)])
    keys = [None if i % 7 == 0 else b"k%d" % (i % 13) for i in range(n)]
    headers = [{"i": b"%d" % i} if i % 5 == 0 else None for i in range(n)]
    got: list[tuple[BaseException | None, BatchMetadata]] = []
    with Producer({"bootstrap.servers": bs, "batch.size": 2048}) as p:
        fut = p.produce_batch(
            topic,
            values,
            keys,
            headers=headers,
            timestamps=list(range(1000, 1000 + n)),
            on_delivery=lambda e, m: got.append((e, m)),
        )
        md = fut.result(30)
        assert p.flush(10) == 0
    assert len(got) == 1 and got[0][0] is None and got[0][1] is md
    assert md.count == n and md.without_offset == 0
    assert sum(c for runs in md.offsets.values() for _, c in runs) == n
    records = read_topic(bs, topic)
    assert len(records) == n
    by_part: dict[int, list[Any]] = {}
    for r in records:
        by_part.setdefault(r.partition, []).append(r)
    for part, recs in by_part.items():
        # call order within each partition, at the offsets the future reported
        idx = [int(r.value[1:]) for r in recs]
        assert idx == sorted(idx)
        offsets = [o for base, c in md.offsets[part] for o in range(base, base + c)]
        assert offsets == [r.offset for r in recs]
        for r, i in zip(recs, idx, strict=True):
            assert r.key == keys[i]
            assert r.timestamp == 1000 + i
            assert r.headers == ((("i", b"%d" % i),) if i % 5 == 0 else ())
            if keys[i] is not None:
                assert part == partition_for_key(keys[i], 3)


def test_unkeyed_burst_spreads_over_partitions_one_batch_each(shared_broker: Any) -> None:
    bs = shared_broker.bootstrap
    topic = _topic(bs, 4)
    n = 4000  # ~500 KB of 100-byte values, batch.size 16 KB: ~30 batches
    with Producer({"bootstrap.servers": bs, "batch.size": 16_384}) as p:
        md = p.produce_batch(topic, [b"x" * 100] * n).result(30)
    counts = {part: sum(c for _, c in runs) for part, runs in md.offsets.items()}
    assert sum(counts.values()) == n
    assert len(counts) == 4, counts  # sticky per batch, not one partition for the whole burst


def test_produce_and_produce_batch_keep_their_order_in_a_partition(shared_broker: Any) -> None:
    bs = shared_broker.bootstrap
    topic = _topic(bs, 2)
    expected: list[bytes] = []
    with Producer({"bootstrap.servers": bs, "linger.ms": 50}) as p:
        for round_ in range(4):
            for i in range(30):
                v = b"r%d-single-%d" % (round_, i)
                p.produce(topic, v, partition=1)
                expected.append(v)
            vals = [b"r%d-batch-%d" % (round_, i) for i in range(300)]
            p.produce_batch(topic, vals, partition=1)
            expected += vals
        assert p.flush(30) == 0
    assert [r.value for r in read_topic(bs, topic) if r.partition == 1] == expected


def test_bad_input_raises_and_queues_nothing(shared_broker: Any) -> None:
    bs = shared_broker.bootstrap
    topic = _topic(bs, 2)
    with Producer({"bootstrap.servers": bs}) as p:
        with pytest.raises(TypeError):
            p.produce_batch(topic, [b"a", 3])  # not bytes/str
        with pytest.raises(ValueError, match="keys"):
            p.produce_batch(topic, [b"a", b"b"], [b"k"])
        with pytest.raises(ValueError, match="timestamp"):
            p.produce_batch(topic, [b"a"], timestamps=[-5])
        with pytest.raises(ValueError, match="partition"):
            p.produce_batch(topic, [b"a"], partition=-3)
        with pytest.raises(TypeError):
            p.produce_batch(topic, b"not a column")
        assert len(p) == 0
        empty = p.produce_batch(topic, pa.array([], pa.binary())).result(5)
        assert (empty.count, empty.offsets) == (0, {})
        # a partition the topic lacks fails those rows only
        fut = p.produce_batch(topic, [b"ok0", b"bad", b"ok1"], partition=[0, 7, 1])
        with pytest.raises(KafkaError, match="no partition 7"):
            fut.result(30)
        assert p.flush(10) == 0
    assert sorted(r.value for r in read_topic(bs, topic)) == [b"ok0", b"ok1"]


def test_a_call_larger_than_buffer_memory_is_bounded_and_delivered(shared_broker: Any) -> None:
    bs = shared_broker.bootstrap
    topic = _topic(bs, 2)
    n = 20_000  # ~2.5 MB against a 512 KB buffer: queued in chunks, each waiting for space
    config = {"bootstrap.servers": bs, "buffer.memory": 512 * 1024, "batch.size": 32 * 1024}
    with Producer(config) as p:
        accumulator, buffer = p._core.accumulator, p._core.buffer
        release = accumulator.release_bytes
        peak = 0

        def watch(size: int) -> None:  # what is held after each release, as it goes
            nonlocal peak
            release(size)
            peak = max(peak, buffer.held())

        accumulator.release_bytes = watch  # type: ignore[method-assign]
        md = p.produce_batch(topic, [b"y" * 100] * n).result(60)
        assert buffer.held() == 0
    assert md.count == n
    assert 0 < peak <= 512 * 1024
    assert len(read_topic(bs, topic)) == n


def test_transactional_produce_batch_commit_and_abort(shared_broker: Any) -> None:
    bs = shared_broker.bootstrap
    topic = _topic(bs, 3)
    config = {"bootstrap.servers": bs, "transactional.id": f"pb-{uuid.uuid4().hex[:6]}"}
    with Producer(config) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce_batch(
            topic, [b"aborted-%d" % i for i in range(500)], [b"k%d" % i for i in range(500)]
        )
        p.abort_transaction()
        p.begin_transaction()
        fut = p.produce_batch(
            topic, [b"kept-%d" % i for i in range(500)], [b"k%d" % i for i in range(500)]
        )
        p.commit_transaction()
        assert fut.result(0).count == 500
    values = sorted(r.value for r in read_topic(bs, topic))
    assert values == sorted(b"kept-%d" % i for i in range(500))


def test_async_produce_batch(shared_broker: Any) -> None:
    bs = shared_broker.bootstrap
    topic = _topic(bs, 2)

    async def main() -> BatchMetadata:
        async with AsyncProducer({"bootstrap.servers": bs}) as p:
            empty = await p.produce_batch(topic, [])
            assert (await asyncio.wait_for(empty, 5)).count == 0
            fut = await p.produce_batch(topic, pa.array(["a", None, "c"]), partition=0)
            return await asyncio.wait_for(fut, 30)

    md = asyncio.run(main())
    assert md.offsets == {0: [(0, 3)]}
    assert [r.value for r in read_topic(bs, topic)] == [b"a", None, b"c"]


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_compressed_batches(shared_broker: Any, codec: str) -> None:
    bs = shared_broker.bootstrap
    topic = _topic(bs, 2)
    values = [b"c%05d" % i + b"z" * 50 for i in range(3000)]
    config = {"bootstrap.servers": bs, "compression.type": codec, "batch.size": 8192}
    with Producer(config) as p:
        md = p.produce_batch(topic, values, partition=1).result(30)
    assert md.offsets == {1: [(0, 3000)]}
    assert [r.value for r in read_topic(bs, topic)] == values


def test_resumed_identity_skips_rows_written_after_the_checkpoint(shared_broker: Any) -> None:
    bs = shared_broker.bootstrap
    topic = _topic(bs, 1)
    rows = [b"r%05d" % i for i in range(2000)]
    config = {"bootstrap.servers": bs, "batch.size": 4096}
    with Producer(config) as first:
        first.produce_batch(topic, rows[:1000]).result(30)
        state = first.state()  # the checkpoint: rows before 1000 written
        first.produce_batch(topic, rows[1000:1150]).result(30)  # written, not checkpointed
    with Producer(config, state=state) as resumed:  # replays from the checkpoint
        md = resumed.produce_batch(topic, rows[1000:]).result(30)
    assert md.without_offset == 150  # recognised as written by the first incarnation
    assert sum(c for _, c in md.offsets[0]) == 850
    assert md.offsets[0][0][0] == 1150
    assert [r.value for r in read_topic(bs, topic)] == rows


def _batch_sizes(data_dir: Any, topic: str) -> list[int]:
    """Sizes of the record batches in the broker's log of ``topic``'s partition 0."""
    from samsa.protocol.records import iter_batches

    (part_dir,) = [d for d in data_dir.rglob(f"{topic}-0") if d.is_dir()]
    sizes = []
    for seg in sorted(part_dir.glob("*.log")):
        sizes += [b.size for b in iter_batches(seg.read_bytes())]
    return sizes


def test_batches_grow_past_batch_size_up_to_what_the_broker_takes(broker_factory: Any) -> None:
    """produce_batch() hands over whole columns: its batches are as large as the topic's
    max.message.bytes (asked with DescribeConfigs) and max.request.size allow."""
    b = broker_factory(overrides={"message.max.bytes": "65536"}).start()
    n = 4000  # ~450 KB: 28 batches of batch.size, 8 of the topic's limit
    values = pa.array([b"v%099d" % i for i in range(n)])
    for request_max, limit in ((1_048_576, 65_536), (32_768, 32_768)):
        topic = _topic(b.bootstrap, 1)
        config = {
            "bootstrap.servers": b.bootstrap,
            "batch.size": 16_384,
            "max.request.size": request_max,
        }
        with Producer(config) as p:
            md = p.produce_batch(topic, values).result(30)
        assert md.count == n and md.offsets == {0: [(0, n)]}
        sizes = _batch_sizes(b.data_dir, topic)
        assert len(sizes) < n // 200
        assert max(sizes) <= limit and max(sizes) > limit // 2, (limit, sizes)
        assert [r.value for r in read_topic(b.bootstrap, topic)] == values.to_pylist()


def test_a_produce_request_carries_at_most_max_request_size(
    shared_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One batch per partition per request, as long as the request stays within
    max.request.size; the batches that do not fit go in the next request."""
    from samsa.client._aconn import AsyncConnection
    from samsa.protocol.messages import ApiKey

    bs = shared_broker.bootstrap
    topic = _topic(bs, 4)
    carried: list[int] = []
    real_send = AsyncConnection.send_nowait

    def spy(self: Any, api_key: int, entity: Any, **kw: Any) -> Any:
        if api_key == ApiKey.PRODUCE:
            carried.append(sum(len(p.records) for t in entity.topic_data for p in t.partition_data))
        return real_send(self, api_key, entity, **kw)

    monkeypatch.setattr(AsyncConnection, "send_nowait", spy)
    n = 2000  # ~240 KB over 4 partitions: 2 batches of ~30 KB per partition
    limit = 32_768

    async def main() -> BatchMetadata:
        config = {"bootstrap.servers": bs, "batch.size": 16_384, "max.request.size": limit}
        async with AsyncProducer(config) as p:
            await p.wait_metadata(topic)  # the topic's limit is known: 32 KB batches
            fut = await p.produce_batch(topic, [b"x" * 100] * n, [b"%d" % i for i in range(n)])
            return await fut

    md = asyncio.run(main())
    assert md.count == n
    assert len(carried) >= 8 and max(carried) <= limit, carried
    assert max(carried) > limit // 2  # full-size batches, one per request
