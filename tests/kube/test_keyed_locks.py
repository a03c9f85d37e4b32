"""The notebook-controller's per-Notebook locks (notebook_controller/keyed_locks.py): one
holder at a time per Notebook, the others in turn, and nothing kept once nobody holds or
waits (10,000 idle Notebooks keep no lock)."""

from __future__ import annotations

import asyncio

from notebook_controller.keyed_locks import KeyedLocks


def test_a_notebooks_holders_take_turns_and_nothing_is_kept_after():
    async def scenario() -> None:
        locks = KeyedLocks()
        inside: dict[str, int] = {"a": 0, "b": 0}
        most: dict[str, int] = {"a": 0, "b": 0}
        order: list[tuple[str, int]] = []

        async def hold(key: str, n: int) -> None:
            async with locks.hold(key):
                inside[key] += 1
                most[key] = max(most[key], inside[key])
                order.append((key, n))
                await asyncio.sleep(0)  # another holder gets a chance to run
                await asyncio.sleep(0)
                inside[key] -= 1

        tasks = [asyncio.create_task(hold(key, n)) for n in range(5) for key in "ab"]
        await asyncio.sleep(0)
        assert len(locks) == 2  # held and waited for: kept
        await asyncio.gather(*tasks)
        assert most == {"a": 1, "b": 1}  # one holder at a time per key
        assert [n for key, n in order if key == "a"] == list(range(5))  # in turn
        assert len(locks) == 0  # nobody holds or waits: nothing kept

        # A holder that fails lets the next one in, and leaves nothing behind.
        async def fail() -> None:
            async with locks.hold("a"):
                raise RuntimeError("reconcile failed")

        results = await asyncio.gather(fail(), hold("a", 9), return_exceptions=True)
        assert isinstance(results[0], RuntimeError) and results[1] is None
        assert order[-1] == ("a", 9) and len(locks) == 0

    asyncio.run(scenario())
