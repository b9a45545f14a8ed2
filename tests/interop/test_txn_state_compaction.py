"""``__transaction_state`` compacted end to end: 2,000 short transactions over 20
transactional ids (samsa's client) write ~8,000 records; with small segments the cleaner
keeps about the last one per id, so a restart replays about 20 records, not the history;
and every id resumes where it was: same producer id, the epoch one up."""

from __future__ import annotations

import threading
import time

from _broker import BrokerProcess
from samsa.client import Admin, Producer
from samsa.testing import read_topic

IDS = 20
TXNS_PER_ID = 100  # 2,000 transactions
TXN_STATE = "__transaction_state"


def _history(bootstrap: str) -> int:
    return len(read_topic(bootstrap, TXN_STATE, committed=False, timeout=20.0))


def test_transaction_state_is_compacted_and_replays_bounded(
    broker_factory: type[BrokerProcess],
) -> None:
    broker = broker_factory(
        overrides={
            "transaction.state.log.num.partitions": "1",
            "transaction.state.log.segment.bytes": "16384",
            "log.cleaner.backoff.ms": "100",
        }
    ).start()
    bs = broker.bootstrap
    tids = [f"compact-{i}" for i in range(IDS)]
    with Admin({"bootstrap.servers": bs}) as admin:
        admin.create_topic("payload", 1)
    failures: list[BaseException] = []

    def run(tid: str) -> None:
        try:
            with Producer({"bootstrap.servers": bs, "transactional.id": tid}) as p:
                p.init_transactions()
                for i in range(TXNS_PER_ID):
                    p.begin_transaction()
                    p.produce("payload", b"%s-%d" % (tid.encode(), i))
                    p.commit_transaction()
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in tids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and failures == []

    # Each transaction wrote Ongoing, PrepareCommit and CompleteCommit; wait for the cleaner.
    assert broker.wait_for_log(f"{TXN_STATE}-0: ", timeout=30) is not None
    deadline = time.monotonic() + 30
    while (kept := _history(bs)) > 4 * IDS and time.monotonic() < deadline:
        time.sleep(0.5)
    assert kept <= 4 * IDS, f"{kept} records of __transaction_state kept"

    with Admin({"bootstrap.servers": bs}) as admin:
        before = admin.describe_transactions(tids)
    assert {d.state for d in before.values()} == {"CompleteCommit"}

    broker.stop()
    broker.start()
    replayed = _history(bs)
    assert replayed <= 4 * IDS, f"the restart replays {replayed} records"
    with Admin({"bootstrap.servers": bs}) as admin:
        after = admin.describe_transactions(tids)
    assert {t: (d.producer_id, d.epoch, d.state) for t, d in after.items()} == {
        t: (d.producer_id, d.epoch, d.state) for t, d in before.items()
    }
    for tid in tids[:3]:
        with Producer({"bootstrap.servers": bs, "transactional.id": tid}) as p:
            p.init_transactions()  # InitProducerId: the same producer id, the epoch one up
            resumed = p.state()
            assert (resumed.producer_id, resumed.epoch) == (
                before[tid].producer_id,
                before[tid].epoch + 1,
            )
            p.begin_transaction()
            p.produce("payload", b"after restart")
            p.commit_transaction()
