"""Following a job until it ends (jobs/follow.py), the loop JobService.wait, `mlcluster run`,
the kernel's monitor and REST's followed logs share: every line, in order, then the end;
woken by the store's change feed, not by its backstop; a job its own thread settles is seen
to end; a purge ends the follow with UnknownJob."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from jupyterlab_mlcluster.jobs.follow import JobFollower
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
from jupyterlab_mlcluster.jobs.record import JobRecord, new_job_id
from jupyterlab_mlcluster.jobs.storage.logfiles import format_log_line
from jupyterlab_mlcluster.jobs.storage.store import JobStore, UnknownJob
from jupyterlab_mlcluster.jobs.storage.watch import StoreBell

LONG = 600.0  # a backstop only a write can cut short within the test's time
needs_inotify = pytest.mark.skipif(
    StoreBell.open("/") is None, reason="no inotify here: followers poll"
)


def running_job(store: JobStore, workers: int = 2) -> str:
    job_id = new_job_id()
    spec = JobSpec.from_options({"workers": workers})
    store.insert_job(
        JobRecord(id=job_id, name="followed", spec=spec, state=JobState.QUEUED, created=0.0),
        b"payload",
    )
    store.transition(job_id, JobState.RUNNING, started=time.time())
    return job_id


class Supervisor:
    """Writes a job's output and its end as a supervisor does (log lines, then the "logs"
    event; final only after the output), on a connection of its own (its own thread)."""

    def __init__(self, root, job_id: str):
        self.root, self.job_id = root, job_id

    def _in_thread(self, fn) -> None:
        errors: list[BaseException] = []

        def run():
            try:
                fn(JobStore(self.root))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(60)
        assert not errors, errors

    def prints(self, rank: int, *texts: str) -> None:
        def write(store: JobStore) -> None:
            store.log_dir(self.job_id).mkdir(exist_ok=True)
            with open(store.log_path(self.job_id, rank), "ab") as f:
                for text in texts:
                    f.write(format_log_line(time.time(), "o", text))
            store.notify(self.job_id, "logs")

        self._in_thread(write)

    def ends(self, state: JobState = JobState.SUCCEEDED) -> None:
        self._in_thread(lambda store: store.transition(self.job_id, state, finished=time.time()))


def test_every_line_in_order_then_the_end(store_dir):
    store = JobStore(store_dir)
    job_id = running_job(store)
    sup = Supervisor(store.root, job_id)
    sup.prints(0, "a0", "b0")
    seen: list[str] = []
    steps = []
    follower = JobFollower(store, job_id, backstop=0.01)
    for step in follower.steps():
        steps.append(step)
        seen += [f"{line['rank']}:{line['line']}" for line in step.lines]
        if len(steps) == 1:
            sup.prints(1, "a1")
        if len(steps) == 3:
            # Output written before the job is made final is read after the final record.
            sup.prints(0, "c0")
            sup.ends()
    assert seen == ["0:a0", "0:b0", "1:a1", "0:c0"]
    assert steps[-1].done and steps[-1].record.state == JobState.SUCCEEDED
    assert not any(step.done for step in steps[:-1])
    assert steps[-1].cursor == follower.cursor and follower.cursor


@needs_inotify
def test_a_write_by_another_connection_wakes_it_not_the_backstop(store_dir):
    store = JobStore(store_dir)
    job_id = running_job(store)
    sup = Supervisor(store.root, job_id)
    follower = JobFollower(store, job_id, backstop=LONG)
    steps = follower.steps()
    assert next(steps).lines == []
    woken = []

    def writer():
        time.sleep(0.2)  # the follower is waiting by now (it would wait LONG)
        sup.prints(0, "hello")
        sup.ends()

    threading.Thread(target=writer, daemon=True).start()
    started = time.monotonic()
    for step in steps:
        woken += step.lines
    assert [line["line"] for line in woken] == ["hello"]
    assert time.monotonic() - started < 30  # the writes woke it; LONG would be 600 s
    assert follower.record.final


def test_until_final_returns_the_final_record_or_the_last_one_at_the_timeout(store_dir):
    store = JobStore(store_dir)
    job_id = running_job(store)
    record = JobFollower(store, job_id, logs=False, backstop=0.01).until_final(timeout=0.2)
    assert record.state == JobState.RUNNING
    threading.Timer(0.2, Supervisor(store.root, job_id).ends, (JobState.FAILED,)).start()
    record = JobFollower(store, job_id, logs=False, backstop=0.05).until_final(timeout=60)
    assert record.state == JobState.FAILED


def test_a_job_its_own_thread_settles_is_seen_to_end(store_dir):
    """The reaper commits on the follower's own connection, which the change feed does not
    report: the reap naming the job makes the follower read it again."""
    store = JobStore(store_dir)
    job_id = running_job(store)
    reaps = []

    def reap() -> list[str]:
        reaps.append(1)
        if len(reaps) < 3:
            return []
        store.transition(job_id, JobState.FAILED, error="its supervisor was lost")
        return [job_id]

    record = JobFollower(store, job_id, logs=False, reap=reap, backstop=0.01).until_final(60)
    assert record.state == JobState.FAILED and len(reaps) == 3


def test_a_purged_job_ends_the_follow_with_unknown_job(store_dir):
    store = JobStore(store_dir)
    job_id = running_job(store)
    follower = JobFollower(store, job_id, backstop=0.01)
    steps = follower.steps()
    next(steps)
    threading.Thread(target=lambda: JobStore(store.root).delete_job(job_id)).start()
    with pytest.raises(UnknownJob):
        for _ in steps:
            pass


def test_async_follow_with_an_outside_wake_up_reads_in_the_executor(store_dir):
    """The server's way: its broadcaster sets an event when the job changes, and the blocking
    look runs in an executor while the event loop goes on."""
    store = JobStore(store_dir)
    job_id = running_job(store)
    sup = Supervisor(store.root, job_id)
    sup.prints(0, "first")

    async def main() -> tuple[list[str], list[str]]:
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        follower = JobFollower(store, job_id, wake=changed, max_bytes=64 * 1024)
        threads: list[str] = []

        async def run(step):
            def look():
                threads.append(threading.current_thread().name)
                return step()

            return await loop.run_in_executor(None, look)

        lines: list[str] = []
        async for step in follower.steps_async(run=run):
            lines += [line["line"] for line in step.lines]
            if lines == ["first"] and not step.lines:
                await asyncio.to_thread(sup.prints, 1, "second")
                await asyncio.to_thread(sup.ends)
                changed.set()  # what the broadcaster does for this job's changes
        return lines, threads

    lines, threads = asyncio.run(main())
    assert lines == ["first", "second"]
    assert threading.main_thread().name not in threads


def test_a_followed_rank_and_a_tail(store_dir):
    store = JobStore(store_dir)
    job_id = running_job(store)
    sup = Supervisor(store.root, job_id)
    sup.prints(0, *(f"line {i}" for i in range(10)))
    sup.prints(1, "other rank")
    sup.ends()
    follower = JobFollower(store, job_id, rank=0, tail=3, backstop=0.01)
    lines = [line["line"] for step in follower.steps() for line in step.lines]
    assert lines == ["line 7", "line 8", "line 9"]


@needs_inotify
def test_an_async_follower_is_woken_by_the_end_not_its_backstop(store_dir):
    store = JobStore(store_dir)
    job_id = running_job(store)
    sup = Supervisor(store.root, job_id)

    async def main() -> float:
        follower = JobFollower(store, job_id, backstop=LONG)
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, lambda: threading.Thread(target=sup.ends).start())
        started = time.monotonic()
        async for _ in follower.steps_async():
            pass
        return time.monotonic() - started

    assert asyncio.run(main()) < 30  # LONG would be 600 s


@needs_inotify
def test_the_services_followed_logs_and_wait_use_it(store_dir):
    """`mlcluster logs --follow` (JobService.follow_logs) and JobService.wait: every line,
    then the end, of a job whose supervisor (this process, alive) writes from elsewhere."""
    import os

    import psutil

    from jupyterlab_mlcluster.config import MLClusterConfig
    from jupyterlab_mlcluster.jobs.running.processes import this_host
    from jupyterlab_mlcluster.jobs.service import JobService

    store = JobStore(store_dir)
    job_id = new_job_id()
    spec = JobSpec.from_options({"workers": 1})
    store.insert_job(
        JobRecord(id=job_id, name="followed", spec=spec, state=JobState.QUEUED, created=0.0),
        b"payload",
    )
    me = {"pid": os.getpid(), "create_time": psutil.Process().create_time(), "host": this_host()}
    assert store.claim_supervisor(job_id, me, lambda *_: False)
    store.transition(job_id, JobState.RUNNING, started=time.time())
    service = JobService(MLClusterConfig(warm_pool=False), store)
    sup = Supervisor(store.root, job_id)

    def supervise():
        for n in range(3):
            sup.prints(0, f"line {n}")
            time.sleep(0.05)
        sup.ends()

    threading.Timer(0.2, supervise).start()
    lines = [line["line"] for line in service.follow_logs(job_id, poll=LONG)]
    assert lines == ["line 0", "line 1", "line 2"]
    assert service.wait(job_id, timeout=60).state == JobState.SUCCEEDED
