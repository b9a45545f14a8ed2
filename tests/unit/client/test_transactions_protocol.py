"""The transactional producer against a scripted fake broker (one node, in-process).

The fake answers every request of the transactional protocol, records what it received,
and returns the error codes a test scripts for the next requests of an API, so each rule of
the client's state machine is checked on the exact requests it causes: order of
AddPartitionsToTxn before Produce, the transactional flag, retries, fencing, the abortable
path and its KIP-360 epoch bump, EndTxn only for a transaction the coordinator knows, and
operations resumed after a timeout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from samsa.client import (
    AbortableTransactionError,
    AsyncProducer,
    ConsumerGroupMetadata,
    KafkaTimeoutError,
    OffsetAndEpoch,
    Producer,
    ProducerFencedError,
    TopicPartition,
    TransactionAbortedError,
    TransactionState,
    TransactionStateError,
)
from samsa.protocol.errors import ErrorCode as E
from samsa.protocol.framing import (
    FrameDecoder,
    frame_response,
    parse_request_header,
    peek_request_header,
)
from samsa.protocol.messages import ApiKey as K
from samsa.protocol.messages import decode_request, encode_response, is_flexible, make
from samsa.protocol.records import iter_batches

VERSIONS = {
    K.API_VERSIONS: (0, 3),
    K.METADATA: (1, 12),
    K.PRODUCE: (3, 9),
    K.FIND_COORDINATOR: (0, 4),
    K.INIT_PRODUCER_ID: (0, 5),
    K.ADD_PARTITIONS_TO_TXN: (0, 3),
    K.ADD_OFFSETS_TO_TXN: (0, 3),
    K.END_TXN: (0, 3),
    K.TXN_OFFSET_COMMIT: (0, 3),
}
TOPIC = "t"


@dataclass
class Sent:
    """One produced batch as the fake saw it."""

    tp: TopicPartition
    producer_id: int
    epoch: int
    base_sequence: int
    count: int
    transactional: bool
    transactional_id: str | None


class FakeBroker:
    def __init__(self, partitions: int = 2) -> None:
        self.partitions = partitions
        self.port = 0
        self.log: list[tuple[int, Any]] = []
        self.errors: dict[int, collections.deque[int]] = collections.defaultdict(collections.deque)
        self.delays: dict[int, float] = {}
        self.batches: list[Sent] = []
        self.producer_id = 4000
        self.epoch = -1
        self.offsets: dict[TopicPartition, int] = collections.defaultdict(int)
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    def script(self, api: int, *codes: int) -> None:
        """Answer the next requests of ``api`` with these error codes, in order."""
        self.errors[api].extend(int(c) for c in codes)

    def requests(self, api: int) -> list[Any]:
        return [r for a, r in self.log if a == api]

    def apis(self) -> list[int]:
        return [a for a, _ in self.log if a not in (K.API_VERSIONS, K.METADATA)]

    async def start(self) -> FakeBroker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        decoder = FrameDecoder(1 << 24)
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(1 << 16):
                for frame in decoder.feed(data):
                    api, v, cid = peek_request_header(frame)
                    flexible = is_flexible(api, v)
                    header = parse_request_header(frame, flexible)
                    req = decode_request(api, v, frame, header.body_offset)
                    self.log.append((api, req))
                    if api in self.delays:
                        await asyncio.sleep(self.delays[api])
                    body = self._answer(api, v, req)
                    writer.write(frame_response(cid, body, flexible and api != K.API_VERSIONS))
                    await writer.drain()

    def _code(self, api: int) -> int:
        q = self.errors[api]
        return q.popleft() if q else 0

    def _answer(self, api: int, v: int, req: Any) -> bytes:
        handlers: dict[int, Callable[[int, Any], Any]] = {
            K.API_VERSIONS: self._api_versions,
            K.METADATA: self._metadata,
            K.FIND_COORDINATOR: self._find_coordinator,
            K.INIT_PRODUCER_ID: self._init_producer_id,
            K.ADD_PARTITIONS_TO_TXN: self._add_partitions,
            K.ADD_OFFSETS_TO_TXN: lambda v, r: self._simple(K.ADD_OFFSETS_TO_TXN, v),
            K.END_TXN: lambda v, r: self._simple(K.END_TXN, v),
            K.TXN_OFFSET_COMMIT: self._txn_offset_commit,
            K.PRODUCE: self._produce,
        }
        return encode_response(api, v, handlers[api](v, req))

    def _api_versions(self, v: int, req: Any) -> Any:
        keys = tuple(
            make(K.API_VERSIONS, v, "ApiVersion", api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(VERSIONS.items())
        )
        return make(
            K.API_VERSIONS, v, "ApiVersionsResponse", error_code=0, api_keys=keys, throttle_time=0
        )

    def _metadata(self, v: int, req: Any) -> Any:
        parts = tuple(
            make(
                K.METADATA,
                v,
                "MetadataResponsePartition",
                error_code=0,
                partition_index=i,
                leader_id=0,
                leader_epoch=0,
                replica_nodes=(0,),
                isr_nodes=(0,),
                offline_replicas=(),
            )
            for i in range(self.partitions)
        )
        topic = make(
            K.METADATA,
            v,
            "MetadataResponseTopic",
            error_code=0,
            name=TOPIC,
            topic_id=uuid.UUID(int=1),
            is_internal=False,
            partitions=parts,
            topic_authorized_operations=-2147483648,
        )
        broker = make(
            K.METADATA, v, "MetadataResponseBroker", node_id=0, host="127.0.0.1", port=self.port
        )
        return make(
            K.METADATA,
            v,
            "MetadataResponse",
            throttle_time=0,
            brokers=(broker,),
            cluster_id="fake",
            controller_id=0,
            topics=(topic,),
        )

    def _find_coordinator(self, v: int, req: Any) -> Any:
        code = self._code(K.FIND_COORDINATOR)
        fields = {"node_id": 0, "host": "127.0.0.1", "port": self.port, "error_code": code}
        if v >= 4:
            c = make(
                K.FIND_COORDINATOR,
                v,
                "Coordinator",
                key=req.coordinator_keys[0],
                error_message=None,
                **fields,
            )
            return make(
                K.FIND_COORDINATOR, v, "FindCoordinatorResponse", throttle_time=0, coordinators=(c,)
            )
        return make(
            K.FIND_COORDINATOR,
            v,
            "FindCoordinatorResponse",
            throttle_time=0,
            error_message=None,
            **fields,
        )

    def _init_producer_id(self, v: int, req: Any) -> Any:
        code = self._code(K.INIT_PRODUCER_ID)
        if code == 0:
            self.epoch += 1  # every InitProducerId of a transactional id bumps (rule 10)
        return make(
            K.INIT_PRODUCER_ID,
            v,
            "InitProducerIdResponse",
            throttle_time=0,
            error_code=code,
            producer_id=self.producer_id if code == 0 else -1,
            producer_epoch=self.epoch if code == 0 else -1,
        )

    def _add_partitions(self, v: int, req: Any) -> Any:
        code = self._code(K.ADD_PARTITIONS_TO_TXN)
        m = "AddPartitionsToTxnPartitionResult"
        topics = tuple(
            make(
                K.ADD_PARTITIONS_TO_TXN,
                v,
                "AddPartitionsToTxnTopicResult",
                name=t.name,
                results_by_partition=tuple(
                    make(
                        K.ADD_PARTITIONS_TO_TXN,
                        v,
                        m,
                        partition_index=p,
                        partition_error_code=code,
                    )
                    for p in t.partitions
                ),
            )
            for t in req.v3_and_below_topics
        )
        return make(
            K.ADD_PARTITIONS_TO_TXN,
            v,
            "AddPartitionsToTxnResponse",
            throttle_time=0,
            results_by_topic_v3_and_below=topics,
        )

    def _simple(self, api: int, v: int) -> Any:
        name = {K.ADD_OFFSETS_TO_TXN: "AddOffsetsToTxnResponse", K.END_TXN: "EndTxnResponse"}
        return make(api, v, name[api], throttle_time=0, error_code=self._code(api))

    def _txn_offset_commit(self, v: int, req: Any) -> Any:
        code = self._code(K.TXN_OFFSET_COMMIT)
        topics = tuple(
            make(
                K.TXN_OFFSET_COMMIT,
                v,
                "TxnOffsetCommitResponseTopic",
                name=t.name,
                partitions=tuple(
                    make(
                        K.TXN_OFFSET_COMMIT,
                        v,
                        "TxnOffsetCommitResponsePartition",
                        partition_index=p.partition_index,
                        error_code=code,
                    )
                    for p in t.partitions
                ),
            )
            for t in req.topics
        )
        return make(
            K.TXN_OFFSET_COMMIT, v, "TxnOffsetCommitResponse", throttle_time=0, topics=topics
        )

    def _produce(self, v: int, req: Any) -> Any:
        out = []
        for t in req.topic_data:
            parts = []
            for p in t.partition_data:
                tp = TopicPartition(t.name, int(p.index))
                code = self._code(K.PRODUCE)
                base = -1
                if code == 0:
                    for b in iter_batches(p.records):
                        self.batches.append(
                            Sent(
                                tp,
                                b.producer_id,
                                b.producer_epoch,
                                b.base_sequence,
                                b.last_offset_delta + 1,
                                b.is_transactional,
                                req.transactional_id,
                            )
                        )
                        base = self.offsets[tp]
                        self.offsets[tp] += b.last_offset_delta + 1
                parts.append(
                    make(
                        K.PRODUCE,
                        v,
                        "PartitionProduceResponse",
                        index=tp.partition,
                        error_code=code,
                        base_offset=base,
                        log_append_time=None,
                        log_start_offset=0,
                        record_errors=(),
                        error_message=None,
                    )
                )
            out.append(
                make(
                    K.PRODUCE,
                    v,
                    "TopicProduceResponse",
                    name=t.name,
                    partition_responses=tuple(parts),
                )
            )
        return make(K.PRODUCE, v, "ProduceResponse", responses=tuple(out), throttle_time=0)


CONFIG = {
    "transactional.id": "txn-1",
    "linger.ms": 0,
    "retry.backoff.ms": 5,
    "max.block.ms": 3000,
    "request.timeout.ms": 3000,
}


@contextlib.asynccontextmanager
async def setup(**overrides: Any) -> AsyncIterator[tuple[FakeBroker, AsyncProducer]]:
    fake = await FakeBroker().start()
    p = AsyncProducer({"bootstrap.servers": f"127.0.0.1:{fake.port}", **CONFIG, **overrides})
    try:
        await p.start()
        yield fake, p
    finally:
        await asyncio.wait_for(p.close(2), 10)
        await fake.close()


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 20))


def test_init_retries_coordinator_errors() -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            assert p.transaction_state is TransactionState.UNINITIALIZED
            fake.script(
                K.INIT_PRODUCER_ID,
                E.CONCURRENT_TRANSACTIONS,
                E.COORDINATOR_LOAD_IN_PROGRESS,
                E.NOT_COORDINATOR,
            )
            await p.init_transactions()
            assert p.transaction_state is TransactionState.READY
            assert (p.producer_id, p.epoch) == (4000, 0)
            inits = fake.requests(K.INIT_PRODUCER_ID)
            assert len(inits) == 4
            assert all(r.transactional_id == "txn-1" for r in inits)
            assert all((r.producer_id, r.producer_epoch) == (-1, -1) for r in inits)
            finds = fake.requests(K.FIND_COORDINATOR)
            assert len(finds) == 2  # found again after NOT_COORDINATOR
            assert all(r.key_type == 1 for r in finds)

    run(main())


def test_add_partitions_precedes_transactional_batches() -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            futs = [await p.send(TOPIC, b"v%d" % i, partition=i % 2) for i in range(6)]
            await p.commit_transaction()
            assert [f.result().offset for f in futs] == [0, 0, 1, 1, 2, 2]
            apis = fake.apis()
            assert apis.index(K.ADD_PARTITIONS_TO_TXN) < apis.index(K.PRODUCE)
            added = {
                (t.name, q)
                for r in fake.requests(K.ADD_PARTITIONS_TO_TXN)
                for t in r.v3_and_below_topics
                for q in t.partitions
            }
            assert added == {(TOPIC, 0), (TOPIC, 1)}
            assert all(b.transactional and b.transactional_id == "txn-1" for b in fake.batches)
            assert all((b.producer_id, b.epoch) == (4000, 0) for b in fake.batches)
            (end,) = fake.requests(K.END_TXN)
            assert end.committed is True
            assert (end.producer_id, end.producer_epoch) == (4000, 0)
            # Sequences go on across transactions of one epoch; partitions are added again.
            n_add = len(fake.requests(K.ADD_PARTITIONS_TO_TXN))
            p.begin_transaction()
            await (await p.send(TOPIC, b"x", partition=0))
            await p.commit_transaction()
            assert len(fake.requests(K.ADD_PARTITIONS_TO_TXN)) == n_add + 1
            assert fake.batches[-1].base_sequence == 3

    run(main())


def test_empty_transaction_sends_no_end_txn() -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            await p.commit_transaction()
            p.begin_transaction()
            await p.abort_transaction()
            assert K.END_TXN not in fake.apis()
            assert p.transaction_state is TransactionState.READY

    run(main())


def test_state_errors() -> None:
    async def main() -> None:
        async with setup() as (_fake, p):
            with pytest.raises(TransactionStateError):
                await p.send(TOPIC, b"x")
            with pytest.raises(TransactionStateError):
                p.begin_transaction()
            await p.init_transactions()
            with pytest.raises(TransactionStateError):
                await p.init_transactions()
            with pytest.raises(TransactionStateError):
                await p.commit_transaction()
            with pytest.raises(TransactionStateError):
                await p.send(TOPIC, b"x")
            p.begin_transaction()
            with pytest.raises(TransactionStateError):
                p.begin_transaction()
        async with setup(**{"transactional.id": None}) as (_fake, q):
            with pytest.raises(TransactionStateError):
                await q.init_transactions()

    run(main())


def test_fenced_add_partitions_fails_every_pending_record() -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            fake.script(K.ADD_PARTITIONS_TO_TXN, E.PRODUCER_FENCED)
            futs = [await p.send(TOPIC, b"v", partition=i % 2) for i in range(4)]
            for f in futs:
                with pytest.raises(ProducerFencedError):
                    await f
            assert p.transaction_state is TransactionState.FATAL_ERROR
            with pytest.raises(ProducerFencedError):
                await p.commit_transaction()
            with pytest.raises(ProducerFencedError):
                await p.abort_transaction()
            assert K.PRODUCE not in fake.apis()

    run(main())


@pytest.mark.parametrize("code", [E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH])
def test_fenced_end_txn_is_fatal(code: int) -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            await (await p.send(TOPIC, b"v"))
            fake.script(K.END_TXN, code)
            with pytest.raises(ProducerFencedError):
                await p.commit_transaction()
            assert p.transaction_state is TransactionState.FATAL_ERROR

    run(main())


def test_stale_epoch_on_produce_is_fatal() -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            fake.script(K.PRODUCE, E.INVALID_PRODUCER_EPOCH)
            fut = await p.send(TOPIC, b"v")
            with pytest.raises(ProducerFencedError):
                await fut
            with pytest.raises(ProducerFencedError):
                await p.commit_transaction()

    run(main())


def test_out_of_order_makes_transaction_abortable_and_abort_bumps_epoch() -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            await (await p.send(TOPIC, b"ok", partition=0))
            fake.script(K.PRODUCE, E.OUT_OF_ORDER_SEQUENCE_NUMBER)
            bad = await p.send(TOPIC, b"bad", partition=0)
            with pytest.raises(AbortableTransactionError):
                await bad
            assert p.transaction_state is TransactionState.ABORTABLE_ERROR
            later = await p.send(TOPIC, b"later", partition=1)  # refused, not sent
            with pytest.raises(AbortableTransactionError):
                await later
            with pytest.raises(AbortableTransactionError):
                await p.commit_transaction()
            await p.abort_transaction()
            ends = fake.requests(K.END_TXN)
            assert [e.committed for e in ends] == [False]
            # KIP-360: the bump names the epoch it replaces, after the EndTxn
            bump = fake.requests(K.INIT_PRODUCER_ID)[-1]
            assert (bump.producer_id, bump.producer_epoch) == (4000, 0)
            apis = fake.apis()
            assert apis.index(K.END_TXN) < len(apis) - 1 - apis[::-1].index(K.INIT_PRODUCER_ID)
            assert (p.producer_id, p.epoch) == (4000, 1)
            assert p.transaction_state is TransactionState.READY
            p.begin_transaction()
            await (await p.send(TOPIC, b"again", partition=0))
            await p.commit_transaction()
            last = fake.batches[-1]
            assert (last.epoch, last.base_sequence) == (1, 0)

    run(main())


def test_abort_drops_unsent_records() -> None:
    async def main() -> None:
        async with setup(**{"linger.ms": 10_000}) as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            futs = [await p.send(TOPIC, b"v", partition=0) for _ in range(3)]
            await p.abort_transaction()
            for f in futs:
                with pytest.raises(TransactionAbortedError):
                    await f
            assert K.PRODUCE not in fake.apis()

    run(main())


def test_send_offsets_to_transaction() -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            meta = ConsumerGroupMetadata("g", 7, "member-1", None)
            await p.send_offsets_to_transaction({TopicPartition("in", 0): 42}, meta)
            await p.commit_transaction()
            assert fake.apis()[-4:] == [
                K.ADD_OFFSETS_TO_TXN,
                K.FIND_COORDINATOR,
                K.TXN_OFFSET_COMMIT,
                K.END_TXN,
            ]
            (add,) = fake.requests(K.ADD_OFFSETS_TO_TXN)
            assert add.group_id == "g"
            assert fake.requests(K.FIND_COORDINATOR)[-1].key_type == 0
            (commit,) = fake.requests(K.TXN_OFFSET_COMMIT)
            assert (commit.group_id, commit.generation_id, commit.member_id) == ("g", 7, "member-1")
            part = commit.topics[0].partitions[0]
            assert (commit.topics[0].name, part.partition_index, part.committed_offset) == (
                "in",
                0,
                42,
            )
            assert part.committed_leader_epoch == -1  # a bare offset carries no epoch
            # with the consumed record's leader epoch, as Java's OffsetAndMetadata carries it
            p.begin_transaction()
            await p.send_offsets_to_transaction({("in", 1): OffsetAndEpoch(50, 3)}, meta)
            await p.commit_transaction()
            part = fake.requests(K.TXN_OFFSET_COMMIT)[-1].topics[0].partitions[0]
            assert (part.partition_index, part.committed_offset, part.committed_leader_epoch) == (
                1,
                50,
                3,
            )
            # a member fenced by a rebalance: its offsets must not commit
            p.begin_transaction()
            fake.script(K.TXN_OFFSET_COMMIT, E.ILLEGAL_GENERATION)
            with pytest.raises(AbortableTransactionError):
                await p.send_offsets_to_transaction({("in", 0): 43}, meta)
            assert p.transaction_state is TransactionState.ABORTABLE_ERROR
            await p.abort_transaction()
            assert fake.requests(K.END_TXN)[-1].committed is False

    run(main())


def test_commit_resumes_after_timeout() -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            await (await p.send(TOPIC, b"v"))
            fake.delays[K.END_TXN] = 0.5
            with pytest.raises(KafkaTimeoutError):
                await p.commit_transaction(timeout=0.05)
            assert p.transaction_state is TransactionState.COMMITTING
            with pytest.raises(TransactionStateError):
                await p.abort_transaction()
            await p.commit_transaction(timeout=5)
            assert len(fake.requests(K.END_TXN)) == 1
            assert p.transaction_state is TransactionState.READY

    run(main())


def test_concurrent_transactions_on_end_txn_is_retried() -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            await (await p.send(TOPIC, b"v"))
            fake.script(K.END_TXN, E.CONCURRENT_TRANSACTIONS, E.NOT_COORDINATOR)
            await p.commit_transaction()
            assert len(fake.requests(K.END_TXN)) == 3

    run(main())


def test_prepare_and_resume_from_another_producer() -> None:
    async def main() -> None:
        async with setup() as (fake, p):
            await p.init_transactions()
            p.begin_transaction()
            await p.send(TOPIC, b"v")
            prepared = await p.prepare_transaction()
            assert prepared.started and prepared.transactional_id == "txn-1"
            assert (prepared.producer_id, prepared.epoch) == (p.producer_id, p.epoch)
            assert p.transaction_state is TransactionState.PREPARED
            with pytest.raises(TransactionStateError):
                p.begin_transaction()
            bootstrap = {"bootstrap.servers": f"127.0.0.1:{fake.port}", **CONFIG}
            n_end = len(fake.requests(K.END_TXN))
            txn = await AsyncProducer.resume_transaction(bootstrap, prepared)
            try:
                await txn.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "driver")
                await txn.commit()
                await txn.commit()  # repeated: no second EndTxn
                with pytest.raises(TransactionStateError):
                    await txn.abort()
            finally:
                await txn.close()
            ends = fake.requests(K.END_TXN)[n_end:]
            assert [
                (e.transactional_id, e.producer_id, e.producer_epoch, e.committed) for e in ends
            ] == [("txn-1", prepared.producer_id, prepared.epoch, True)]
            commit = fake.requests(K.TXN_OFFSET_COMMIT)[-1]
            assert (commit.group_id, commit.generation_id, commit.member_id) == ("driver", -1, "")
            # the original producer closes without aborting the handed-over transaction
        assert [e.committed for e in fake.requests(K.END_TXN)] == [True]

    run(main())


def test_resume_by_ids_and_fenced_resume() -> None:
    async def main() -> None:
        fake = await FakeBroker().start()
        config = {"bootstrap.servers": f"127.0.0.1:{fake.port}", "retry.backoff.ms": 5}
        try:
            txn = await AsyncProducer.resume_transaction(config, "other", 9, 3)
            await txn.abort()
            await txn.close()
            (end,) = fake.requests(K.END_TXN)
            assert (end.transactional_id, end.producer_id, end.producer_epoch) == ("other", 9, 3)
            assert end.committed is False
            fake.script(K.END_TXN, E.PRODUCER_FENCED)
            txn = await AsyncProducer.resume_transaction(config, "other", 9, 3)
            with pytest.raises(ProducerFencedError):
                await txn.commit()
            await txn.close()
        finally:
            await fake.close()

    run(main())


def test_sync_facade_transaction_context() -> None:
    async def serve(started: asyncio.Future[FakeBroker], stop: asyncio.Event) -> None:
        fake = await FakeBroker().start()
        started.set_result(fake)
        await stop.wait()
        await fake.close()

    import threading

    loop = asyncio.new_event_loop()
    started: asyncio.Future[FakeBroker] = loop.create_future()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(started, stop),))
    thread.start()
    try:
        while not started.done():
            threading.Event().wait(0.01)
        fake = started.result()
        with Producer({"bootstrap.servers": f"127.0.0.1:{fake.port}", **CONFIG}) as p:
            p.init_transactions()
            with p.transaction():
                f = p.send(TOPIC, "a", partition=0)
            assert f.result(5).offset == 0
            with pytest.raises(RuntimeError), p.transaction():
                p.produce(TOPIC, "b", partition=0)
                raise RuntimeError("boom")
            assert p.transaction_state is TransactionState.READY
            with pytest.raises(TransactionStateError):
                p.produce(TOPIC, "outside")
        assert [e.committed for e in fake.requests(K.END_TXN)] == [True, False]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
