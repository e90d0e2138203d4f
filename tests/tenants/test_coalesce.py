"""Coalescing concurrent calls into batches (tenants.infra.coalesce)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from tenants.infra.coalesce import Coalescer


def test_calls_made_together_share_a_batch_and_get_their_own_results() -> None:
    batches: list[list[int]] = []

    async def run(items: Sequence[int]) -> list[int]:
        batches.append(list(items))
        await asyncio.sleep(0)
        return [i * 10 for i in items]

    co: Coalescer[int, int] = Coalescer(run, max_batch=4)

    async def main() -> list[int]:
        alone = await co.call(1)  # an idle loop: a batch of one, at once
        together = await asyncio.gather(*(co.call(i) for i in range(2, 8)))
        return [alone, *together]

    assert asyncio.run(main()) == [10, 20, 30, 40, 50, 60, 70]
    # One alone, then six callers in batches of at most four, in call order.
    assert batches == [[1], [2, 3, 4, 5], [6, 7]]


def test_a_failing_batch_fails_each_of_its_calls_and_the_next_batch_runs() -> None:
    async def run(items: Sequence[int]) -> list[int]:
        if 13 in items:
            raise ValueError("unlucky")
        return list(items)

    co: Coalescer[int, int] = Coalescer(run, max_batch=2)

    async def main() -> list[object]:
        return await asyncio.gather(*(co.call(i) for i in (12, 13, 14, 15)), return_exceptions=True)

    out = asyncio.run(main())
    assert [type(x).__name__ for x in out[:2]] == ["ValueError", "ValueError"]
    assert out[2:] == [14, 15]


def test_a_wrong_number_of_results_is_an_error_not_a_mismatch() -> None:
    async def run(items: Sequence[int]) -> list[int]:
        return [0]

    co: Coalescer[int, int] = Coalescer(run)

    async def main() -> list[object]:
        return await asyncio.gather(co.call(1), co.call(2), return_exceptions=True)

    out = asyncio.run(main())
    assert all(isinstance(x, RuntimeError) for x in out)


def test_a_cancelled_caller_is_left_out_of_its_batch() -> None:
    seen: list[list[str]] = []
    release = asyncio.Event

    async def main() -> tuple[str, list[list[str]]]:
        gate = release()

        async def run(items: Sequence[str]) -> list[str]:
            seen.append(list(items))
            await gate.wait()
            return [s.upper() for s in items]

        co: Coalescer[str, str] = Coalescer(run)
        first = asyncio.ensure_future(co.call("a"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # "a" is in flight; the next two wait for the next batch
        gone = asyncio.ensure_future(co.call("b"))
        kept = asyncio.ensure_future(co.call("c"))
        await asyncio.sleep(0)
        gone.cancel()
        gate.set()
        await first
        return await kept, seen

    kept, seen_batches = asyncio.run(main())
    assert kept == "C"
    assert seen_batches == [["a"], ["c"]]


def test_each_event_loop_has_its_own_batches() -> None:
    loops: list[int] = []

    async def run(items: Sequence[int]) -> list[int]:
        loops.append(id(asyncio.get_running_loop()))
        return list(items)

    co: Coalescer[int, int] = Coalescer(run)
    assert asyncio.run(co.call(1)) == 1
    assert asyncio.run(co.call(2)) == 2
    assert len(loops) == 2


@pytest.mark.parametrize("max_batch", [1, 3])
def test_max_batch_bounds_every_batch(max_batch: int) -> None:
    sizes: list[int] = []

    async def run(items: Sequence[int]) -> list[int]:
        sizes.append(len(items))
        return list(items)

    co: Coalescer[int, int] = Coalescer(run, max_batch=max_batch)

    async def main() -> list[int]:
        return await asyncio.gather(*(co.call(i) for i in range(7)))

    assert asyncio.run(main()) == list(range(7))
    assert max(sizes) <= max_batch and sum(sizes) == 7


def test_single_flight_shares_a_run_per_key_and_forgets_it_after() -> None:
    from tenants.infra.coalesce import SingleFlight

    runs: list[str] = []

    async def main() -> tuple[list[object], list[object]]:
        flight: SingleFlight[str, str] = SingleFlight()

        def make(key: str) -> Any:
            async def fn() -> str:
                runs.append(key)
                await asyncio.sleep(0.01)
                if key == "bad":
                    raise ValueError(key)
                return key.upper()
            return fn

        first = await asyncio.gather(
            *(flight.run(k, make(k)) for k in ("a", "a", "b", "a", "bad", "bad")), return_exceptions=True
        )
        again = [await flight.run("a", make("a"))]  # the run ended: a new one
        return first, again

    first, again = asyncio.run(main())
    assert first[:4] == ["A", "A", "B", "A"]
    assert all(isinstance(x, ValueError) for x in first[4:])
    assert again == ["A"]
    assert sorted(runs) == ["a", "a", "b", "bad"]


def test_single_flight_survives_a_cancelled_caller() -> None:
    from tenants.infra.coalesce import SingleFlight

    async def main() -> str:
        flight: SingleFlight[int, str] = SingleFlight()

        async def slow() -> str:
            await asyncio.sleep(0.02)
            return "done"

        leaver = asyncio.ensure_future(flight.run(1, slow))
        stayer = asyncio.ensure_future(flight.run(1, slow))
        await asyncio.sleep(0)
        leaver.cancel()
        return await stayer

    assert asyncio.run(main()) == "done"
