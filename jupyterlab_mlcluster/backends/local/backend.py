"""The local backend: ranks as processes on this machine, gang-admitted from a shared pool."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from ...jobs import lifecycle
from ...jobs.backend import Backend
from ...jobs.model import JobSpec, JobState, SpecError
from ...jobs.running.processes import supervisor_alive
from ...jobs.running.proctree import (
    START_SLACK,
    Containment,
    Sentinel,
    kill_left_behind,
    kill_orphaned_tree,
)
from ...jobs.sessions import is_session_holder
from ...jobs.storage.store import JobStore
from ...runtime.samplers import RankSampler
from . import pool
from .gang import Gang

if TYPE_CHECKING:
    from ...jobs.forensics import StackReport
    from ...jobs.record import JobRecord
    from ...jobs.running.supervisor import JobContext

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

ADMISSION_POLL = 0.05


class LocalBackend(Backend):
    name = "local"
    honours_grace = True
    watches_stalls = True

    def capacity(self) -> dict[str, Any]:
        c = self.config
        return pool.pool_capacity(c.cpu_slots, c.gpus, c.memory_limit)

    def validate(self, spec: JobSpec) -> None:
        if spec.workers > self.config.max_workers:
            raise SpecError(
                f"workers must be at most {self.config.max_workers} (MLClusterConfig.max_workers)"
            )
        if spec.image:
            raise SpecError(
                "--image only applies to the kubernetes backend; local ranks use this environment"
            )
        if spec.queue:
            raise SpecError(
                "--queue only applies to the kubernetes (Volcano/Kueue queues) and slurm"
                " (partitions) backends"
            )
        pool.check_fits(spec, self.capacity())

    def cleanup_orphans(self, store: JobStore, job: JobRecord) -> None:
        """Kill whatever a dead supervisor's ranks left: their groups, the job's cgroup,
        what they started elsewhere (jobs/running/proctree.py)."""
        kill_orphaned_tree(store.job_dir(job.id), job.id, store.rank_processes(job.id))

    def collect_stacks(
        self, store: JobStore, job: JobRecord, ranks: list[int] | None, native: bool
    ) -> StackReport:
        """Read the ranks' processes here (py-spy, or their own helper): jobs/forensics/."""
        from ...jobs import forensics

        # A session's cell runs on its session's ranks: theirs are the processes.
        source = job.origin.get("session_job") or job.id
        wanted = range(job.spec.workers) if ranks is None else ranks
        processes = {rank: (pid, started) for rank, pid, started in store.rank_processes(source)}
        helper = self.config.stacks_helper and not job.origin.get("session_job")
        targets, missing = [], {}
        for rank in wanted:
            if rank not in processes:
                missing[rank] = "it has no process yet"
                continue
            pid, started = processes[rank]
            path = forensics.helper_file(store.job_dir(source), rank) if helper else None
            targets.append(forensics.Target(rank, pid, started, path))
        return forensics.read_targets(
            job.id,
            targets,
            native=native,
            reader=self.config.stacks_reader,
            py_spy_setting=self.config.py_spy,
            missing=missing,
        )

    # -- inside the supervisor -------------------------------------------------------------

    def run(self, ctx: JobContext) -> None:
        spec: JobSpec = ctx.job.spec
        allocation = self._admit(ctx)
        if allocation is None:
            return
        log.debug("admitted")
        launch = ctx.store.read_launch(ctx.job.id)
        sampler = RankSampler()
        tree = Containment(ctx.store.job_dir(ctx.job.id), ctx.job.id, ctx.config.rank_cgroup)
        # Forked before any rank: should this process be killed, it ends what they started.
        sentinel = Sentinel(lambda started: _after_supervisor_death(ctx, started))
        tree.spare(sentinel.pid)
        try:
            if is_session_holder(ctx.job):
                from .session import serve_session

                serve_session(ctx, spec, allocation, launch, sampler, tree)
                return
            lifecycle.run_attempts(
                ctx, lambda n: Gang(ctx, spec, allocation, launch, n, sampler, tree).run()
            )
        finally:
            sampler.gpu.close()
            tree.close()
            sentinel.release()

    def _admit(self, ctx: JobContext) -> dict[str, Any] | None:
        store, job = ctx.store, ctx.job
        decide = pool.make_decider(supervisor_alive)
        last_reason = 0.0
        while True:
            reason = ctx.cancelled()
            if reason:
                ctx.set_state(JobState.CANCELLED, reason=reason)
                return None
            allocation = store.try_admit(job.id, decide)
            if allocation is not None:
                return allocation
            now = time.monotonic()
            if now - last_reason > 1.0:
                last_reason = now
                ctx.set_reason(self._wait_reason(store, job))
            ctx.tick()
            time.sleep(ADMISSION_POLL)

    def _wait_reason(self, store: JobStore, job: JobRecord) -> str:
        queue = store.queue(job.backend)
        ahead = queue.index(job.id) if job.id in queue else 0
        rows = store.held_allocations(job.backend)
        used = pool.used_resources(
            [json.loads(r["allocation"]) for r in rows if supervisor_alive(r)]
        )
        assert job.capacity is not None  # submit stores every job with its backend's capacity
        return pool.describe_wait(job.spec, job.capacity, used, ahead)


def _after_supervisor_death(ctx: JobContext, since: float) -> None:
    """In the job's sentinel, its supervisor just died: kill what its ranks left, then settle
    the job as any reaper would, in a fresh interpreter (exec): SQLite's locks do not survive
    a fork, so the store is not opened here."""
    kill_left_behind(ctx.store.job_dir(ctx.job.id), ctx.job.id, since - START_SLACK)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.execv(
        sys.executable,
        [sys.executable, "-m", "jupyterlab_mlcluster.jobs.settle", str(ctx.store.root), ctx.job.id],
    )
