"""buffer.memory's one account (``BufferMemory``): reservations from any thread and from
the loop, releases from the loop, what blocks and what wakes."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from samsa.client._accumulator import BufferMemory
from samsa.client._errors import BufferExhaustedError, KafkaError
from samsa.protocol.errors import ErrorCode


def test_the_owner_and_other_threads_reserve_into_one_account() -> None:
    buf = BufferMemory(1000, max_block=1.0)
    assert buf.try_reserve(600)
    assert not buf.try_reserve(500)  # would pass the bound: nothing counted
    other = threading.Thread(target=buf.reserve, args=(300,))
    other.start()
    other.join(5)
    assert buf.held() == 900  # the other thread's bytes count against the owner's bound
    assert not buf.try_reserve(200)
    buf.release(900)
    assert buf.held() == 0
    assert buf.try_reserve(1000)


def test_a_blocked_reserve_waits_for_a_quarter_to_be_free_then_takes_its_bytes() -> None:
    buf = BufferMemory(1000, max_block=10.0)
    buf.add(1000)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (buf.reserve(100), done.set()))
    waiter.start()
    time.sleep(0.1)
    buf.release(100)  # room for the record, but not the quarter a blocked caller waits for
    assert not done.wait(0.2)
    buf.release(200)
    assert done.wait(5)
    waiter.join(5)
    assert buf.held() == 700 + 100


def test_reserve_gives_up_after_max_block_and_refuses_what_never_fits() -> None:
    buf = BufferMemory(1000, max_block=0.1)
    buf.add(950)
    with pytest.raises(BufferExhaustedError):
        buf.reserve(100)
    assert buf.held() == 950  # nothing counted for the refused record
    with pytest.raises(KafkaError) as info:
        buf.reserve(1001)
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE


def test_the_loop_waits_once_full_until_a_release() -> None:
    async def run() -> None:
        buf = BufferMemory(1000, max_block=0.1)
        await buf.wait_async()
        buf.add_from_loop(1000)
        with pytest.raises(BufferExhaustedError):
            await buf.wait_async()
        waiting = asyncio.ensure_future(buf.wait_async())
        await asyncio.sleep(0)
        buf.release(1)
        await asyncio.wait_for(waiting, 1)
        await buf.wait_async_for(1)  # fits: no wait
        with pytest.raises(BufferExhaustedError):
            await buf.wait_async_for(2)

    asyncio.run(run())
