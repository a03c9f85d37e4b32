"""The store's change feed wakes a waiting follower when another process writes the store
(the kernel's monitor waits this way instead of sleeping a fixed poll interval)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs.store import JobStore
from jupyterlab_mlcluster.jobs.watch import StoreBell, StoreWatcher

LONG = 600.0  # a wait that only a write can end within the test's time


def write_from_another_process(root) -> None:
    code = (
        "import sys; from jupyterlab_mlcluster.jobs.store import JobStore; "
        "JobStore(sys.argv[1]).notify('jabcdef0123', 'logs')"
    )
    subprocess.run([sys.executable, "-c", code, str(root)], check=True, timeout=120)


@pytest.mark.skipif(StoreBell.open("/") is None, reason="no inotify here: followers poll")
@pytest.mark.parametrize("mode", ["wal", "delete"])
def test_a_write_by_another_process_wakes_the_waiter(tmp_path, mode):
    store = JobStore(tmp_path / "store", journal_mode=mode)
    watcher = StoreWatcher(store, since=store.last_seq())
    assert not watcher.poll()
    watcher.wait(0.01)  # makes the wake-up (and forgets the writes so far)
    woken = threading.Event()
    waiter = threading.Thread(target=lambda: (watcher.wait(LONG), woken.set()), daemon=True)
    waiter.start()
    write_from_another_process(store.root)
    wait_for(woken.is_set, message="the write to wake the waiter")
    assert watcher.poll().logs == {"jabcdef0123"}
    watcher.close()


@pytest.mark.skipif(StoreBell.open("/") is None, reason="no inotify here: followers poll")
def test_an_async_waiter_is_woken_and_the_loop_runs_meanwhile(tmp_path):
    store = JobStore(tmp_path / "store")
    watcher = StoreWatcher(store, since=store.last_seq())
    ticks = []

    async def main():
        async def other_work():  # the kernel's other messages (a Cancel click) go on
            while True:
                ticks.append(1)
                await asyncio.sleep(0.01)

        worker = asyncio.get_running_loop().create_task(other_work())
        await watcher.wait_async(0.01)
        writer = asyncio.get_running_loop().run_in_executor(
            None, write_from_another_process, store.root
        )
        await asyncio.wait_for(watcher.wait_async(LONG), timeout=LONG / 2)
        await writer
        worker.cancel()

    asyncio.run(main())
    assert ticks
    assert watcher.poll().logs == {"jabcdef0123"}
    watcher.close()


def test_closed_or_missing_wake_up_falls_back_to_sleeping(tmp_path):
    assert StoreBell.open(tmp_path / "no-such-dir") is None
    store = JobStore(tmp_path / "store")
    watcher = StoreWatcher(store)
    watcher.wait(0.001)
    bell = watcher._bell
    watcher.close()
    watcher.close()  # twice is fine
    if bell is not None:  # its descriptor is given back
        with pytest.raises(OSError):
            os.fstat(bell.fd)
    watcher.wait(0.001)  # sleeps, never touches a closed descriptor
    asyncio.run(watcher.wait_async(0.001))
