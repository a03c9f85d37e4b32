"""The store's change feed wakes a waiting follower when another process writes the store
(the kernel's monitor waits this way instead of sleeping a fixed poll interval)."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
import threading
import time

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.storage import watch
from jupyterlab_mlcluster.jobs.storage.store import JobStore
from jupyterlab_mlcluster.jobs.storage.watch import (
    CREATED,
    ENDED,
    IDLE_BELLS_KEPT,
    StoreBell,
    StoreWatcher,
)
from jupyterlab_mlcluster.runtime.payload import Payload

LONG = 600.0  # a wait that only a write can end within the test's time


def write_from_another_process(root) -> None:
    code = (
        "import sys; from jupyterlab_mlcluster.jobs.storage.store import JobStore; "
        "JobStore(sys.argv[1]).notify('jabcdef0123', 'logs')"
    )
    subprocess.run([sys.executable, "-c", code, str(root)], check=True, timeout=120)


def follow_in_a_thread(watcher: StoreWatcher, timeout: float):
    """A watcher is used by one thread (its store connection is that thread's): the thread
    looks, waits (a long time) and looks again until it sees new log lines; -> (woken, what
    it saw each time)."""
    ready, woken, seen = threading.Event(), threading.Event(), []

    def follow():
        assert not watcher.poll()
        watcher.wait(0.01)  # makes (or takes) the wake-up, forgets the writes so far
        ready.set()
        while not seen or not seen[-1].logs:  # (the writer opening the store may commit first)
            watcher.wait(timeout)
            seen.append(watcher.poll())
        woken.set()

    threading.Thread(target=follow, daemon=True).start()
    wait_for(ready.is_set, message="the follower to wait")
    return woken, seen


@pytest.mark.skipif(StoreBell.open("/") is None, reason="no inotify here: followers poll")
@pytest.mark.parametrize("mode", ["wal", "delete"])
def test_a_write_by_another_process_wakes_the_waiter(tmp_path, mode):
    store = JobStore(tmp_path / "store", journal_mode=mode)
    watcher = StoreWatcher(store, since=store.last_seq())
    woken, seen = follow_in_a_thread(watcher, LONG)
    write_from_another_process(store.root)
    wait_for(woken.is_set, message="the write to wake the waiter")
    assert seen[-1].logs == {"jabcdef0123"}
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
    watcher.close()
    watcher.close()  # twice is fine
    watcher.wait(0.001)  # sleeps, never touches a released wake-up
    asyncio.run(watcher.wait_async(0.001))


@pytest.mark.skipif(StoreBell.open("/") is None, reason="no inotify here: followers poll")
def test_a_released_wake_up_serves_the_next_follower_and_the_rest_are_closed(tmp_path, monkeypatch):
    """Closing an inotify instance takes milliseconds (the kernel's RCU grace period): a
    monitor's is kept for the next one (aimed at its directory), a few at most."""
    monkeypatch.setattr(watch, "_IDLE_BELLS", [])
    store = JobStore(tmp_path / "store")
    watchers = [StoreWatcher(store) for _ in range(IDLE_BELLS_KEPT + 2)]
    for watcher in watchers:
        watcher.wait(0.001)
    bells = [watcher._bell for watcher in watchers]
    assert len({bell.fd for bell in bells}) == len(bells)
    for watcher in watchers:
        watcher.close()
    kept = [bell for bell in bells if bell._closer.alive]
    assert len(kept) == IDLE_BELLS_KEPT
    for bell in bells:
        if bell not in kept:
            with pytest.raises(OSError):
                os.fstat(bell.fd)  # given back
    again = StoreWatcher(store, since=store.last_seq())
    woken, seen = follow_in_a_thread(again, LONG)
    assert again._bell in kept  # no new instance made ...
    write_from_another_process(store.root)
    wait_for(woken.is_set, message="the reused wake-up to ring")  # ... and it still rings
    assert seen[-1].logs == {"jabcdef0123"}
    again.close()


@pytest.mark.skipif(StoreBell.open("/") is None, reason="no inotify here: followers poll")
def test_a_created_file_rings_a_growing_one_does_not(tmp_path):
    (tmp_path / "log").write_bytes(b"")
    bell = StoreBell.open(tmp_path, CREATED)
    with open(tmp_path / "log", "ab") as log:
        log.write(b"a line\n")
    assert not select.select([bell.fd], [], [], 0.2)[0]
    (tmp_path / "ended").touch()
    assert select.select([bell.fd], [], [], LONG)[0]
    bell.release()


@pytest.mark.skipif(StoreBell.open("/") is None, reason="no inotify here: followers poll")
def test_a_job_follower_is_woken_by_the_job_ending(service, monkeypatch):
    """The kernel's monitor waits on its job's directory for a file to appear: the supervisor
    makes one once the job is final, so even a follower with a long backstop sees the end."""
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    record = service.submit(
        JobSpec.from_options({"workers": 1}),
        # Runs until cancelled (a rank's stdin is /dev/null: reading it would end at once).
        Payload(source="import time\nwhile True:\n    time.sleep(1)"),
    )
    state = wait_for(
        lambda: (
            (s := service.get(record.id).state) not in (JobState.QUEUED, JobState.STARTING) and s
        ),
        message="the job to start",
    )
    assert state == JobState.RUNNING, state
    job_dir = service.store.job_dir(record.id)
    assert not (job_dir / ENDED).exists()
    watcher = StoreWatcher(service.store, {record.id}, wake_on=(job_dir, CREATED))
    ready, woken = threading.Event(), threading.Event()

    def follow():
        watcher.wait(0.01)
        ready.set()
        while not service.store.get_job(record.id).final:
            watcher.wait(LONG)
        woken.set()

    threading.Thread(target=follow, daemon=True).start()
    wait_for(ready.is_set, message="the follower to wait")
    service.cancel(record.id)
    wait_for(woken.is_set, message="the job's end to wake the follower")
    assert (job_dir / ENDED).exists()
    watcher.close()


@pytest.mark.skipif(StoreBell.open("/") is None, reason="no inotify here: followers poll")
@pytest.mark.parametrize("turns", range(5))
def test_a_cancelled_async_wait_is_never_swallowed(tmp_path, turns):
    """ipykernel interrupts an async cell by cancelling it: a cancellation that comes just as
    a write ends the wait must still reach the cell (asyncio.wait_for before 3.12 swallows
    one that meets its future's completion). `turns`: how many loop turns pass after the
    write before the cancel, to land on the race whatever the loop's order of callbacks."""
    bell = StoreBell.open(tmp_path)

    async def main():
        task = asyncio.get_running_loop().create_task(bell.wait_async(LONG))
        await asyncio.sleep(0)  # the task waits
        (tmp_path / "jobs.db-wal").write_bytes(b"x")  # a write: the next turn ends the wait
        time.sleep(0.01)  # holds the loop: the event is ready by the next turn
        for _ in range(turns):
            await asyncio.sleep(0)
        if task.done():
            return "done"  # ended before the cancel: nothing to swallow
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "swallowed"

    assert asyncio.run(main()) in ("cancelled", "done")
    bell.close()


@pytest.mark.skipif(StoreBell.open("/") is None, reason="no inotify here: followers poll")
def test_a_wake_up_past_descriptor_1024_still_waits(tmp_path):
    """A long-lived process (a Jupyter server, a kernel) holds many descriptors: the wake-up's
    may be past select()'s FD_SETSIZE (1024)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open only {hard} descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    ballast = []
    try:
        while not ballast or ballast[-1] < 1100:
            ballast.append(os.open(os.devnull, os.O_RDONLY))
        with watch._IDLE_LOCK:  # a fresh descriptor, not a kept (low) one
            while watch._IDLE_BELLS:
                watch._IDLE_BELLS.pop().close()
        bell = StoreBell.open(tmp_path)
        assert bell is not None and bell.fd > 1024
        bell.wait(0.01)  # select() raised "filedescriptor out of range" here
        (tmp_path / "x").write_bytes(b"x")
        started = time.monotonic()
        bell.wait(LONG)
        assert time.monotonic() - started < LONG / 2, "woken by the write"
        bell.close()
    finally:
        for fd in ballast:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
