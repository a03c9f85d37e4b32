"""The extension's Prometheus figures, on Jupyter Server's own `/metrics`.

Jupyter Server serves `prometheus_client`'s default registry at `/metrics`; the extension
registers one collector there. Scrapes must never touch SQLite on the event loop, so the
collector only reads a snapshot (`MetricsSnapshot`) that `ServerMetrics` rebuilds in the
extension's executor every `interval` seconds. The snapshot builder is pure over job
records and the cluster summary, so tests can check it without a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ..jobs.model import JobState
from ..jobs.record import JobRecord

log = logging.getLogger(__name__)

# Seconds; jobs run from seconds (a notebook cell) to days (a training).
DURATION_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 72 * 3600)
ADMISSION_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600)

# name -> (kind, help). The one list of series this module exports (the dashboard test
# checks the Grafana board against it).
SERIES: dict[str, tuple[str, str]] = {
    "mlcluster_jobs": ("gauge", "Jobs in the store by state and backend."),
    "mlcluster_queue_length": ("gauge", "Jobs waiting for admission, by backend."),
    "mlcluster_queue_oldest_wait_seconds": (
        "gauge",
        "How long the longest-waiting queued job has waited, by backend.",
    ),
    "mlcluster_job_admission_seconds": (
        "histogram",
        (
            "Time from submission until the whole gang was admitted and started (queue wait "
            "+ gang admission), of jobs that started."
        ),
    ),
    "mlcluster_job_duration_seconds": (
        "histogram",
        "Run time (start to end) of finished jobs, by backend and final state.",
    ),
    "mlcluster_job_restarts": (
        "counter",
        "Gang restarts (--max-restarts) of the jobs in the store, by backend.",
    ),
    "mlcluster_gpus_capacity": ("gauge", "GPUs the default backend has."),
    "mlcluster_gpus_allocated": ("gauge", "GPUs held by starting or running jobs."),
    "mlcluster_cpu_slots_capacity": (
        "gauge",
        "CPU slots (local) or cores the default backend has.",
    ),
    "mlcluster_cpu_slots_allocated": ("gauge", "CPU slots held by starting or running jobs."),
    "mlcluster_user_gpus_allocated": ("gauge", "GPUs held by running jobs, per owner."),
    "mlcluster_rank_cpu_percent": ("gauge", "CPU use of a running job's rank (100 = one core)."),
    "mlcluster_rank_memory_bytes": ("gauge", "Resident memory of a running job's rank."),
    "mlcluster_rank_gpu_utilization_percent": (
        "gauge",
        "GPU utilisation of a running job's rank (mean over its GPUs).",
    ),
    "mlcluster_rank_gpu_memory_bytes": ("gauge", "GPU memory of a running job's rank."),
    "mlcluster_idle_gpu_jobs": (
        "gauge",
        (
            "Running jobs flagged for idle GPUs (every GPU under MLClusterConfig."
            "idle_gpu_percent for MLClusterConfig.idle_gpu_after seconds), by backend."
        ),
    ),
    "mlcluster_idle_gpus": ("gauge", "GPUs held by running jobs flagged idle, per owner."),
    "mlcluster_job_gpu_idle_seconds": (
        "gauge",
        "How long a running job flagged for idle GPUs has had them idle.",
    ),
    "mlcluster_stalled_jobs": (
        "gauge",
        "Running jobs with stalled ranks (no output, progress or CPU for their stall_after), "
        "by backend.",
    ),
    "mlcluster_job_stalled_ranks": ("gauge", "How many ranks of a running job are stalled."),
    "mlcluster_job_stalled_seconds": (
        "gauge",
        "How long the stalled ranks of a running job have done nothing.",
    ),
    "mlcluster_straggling_jobs": (
        "gauge",
        "Running jobs with a straggling rank (its step rate 1.5x under its peers' median for "
        "MLClusterConfig.straggler_after), by backend.",
    ),
    "mlcluster_job_straggler_ranks": ("gauge", "How many ranks of a running job straggle."),
    "mlcluster_metrics_snapshot_timestamp_seconds": (
        "gauge",
        "When the figures above were last read from the job store (Unix time).",
    ),
}

_RANK_FIGURES = {
    "mlcluster_rank_cpu_percent": "cpu_percent",
    "mlcluster_rank_memory_bytes": "memory_bytes",
    "mlcluster_rank_gpu_utilization_percent": "gpu_util",
    "mlcluster_rank_gpu_memory_bytes": "gpu_memory_bytes",
}


def _histogram(
    name: str, labels: list[str], observations: dict[tuple[str, ...], list[float]], buckets
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, SERIES[name][1], labels=labels)
    for key, values in sorted(observations.items()):
        counts = [(str(float(b)), sum(1 for v in values if v <= b)) for b in buckets]
        counts.append(("+Inf", len(values)))
        family.add_metric(list(key), counts, sum_value=sum(values))
    return family


def build_metrics(
    jobs: Iterable[JobRecord], cluster: dict[str, Any] | None, now: float, *, shared: bool = False
) -> list[Metric]:
    """Every family of SERIES from the store's jobs and the cluster summary (pure).

    `shared`: a server shared by many users (trust_identity_header), whose /metrics any of
    them may read: no series is labelled with a user's job ids, job names or identity (the
    per-job and per-owner families are there, without samples); counts by state and backend
    and capacity stay."""
    jobs = list(jobs)
    backends = sorted({j.backend for j in jobs} | ({cluster["backend"]} if cluster else set()))
    by_state = {(s.value, b): 0 for s in JobState for b in backends}
    queued: dict[str, list[float]] = {b: [] for b in backends}
    admission: dict[tuple[str, ...], list[float]] = {}
    durations: dict[tuple[str, ...], list[float]] = {}
    restarts = dict.fromkeys(backends, 0)
    user_gpus: dict[str, int] = {}
    idle_jobs = dict.fromkeys(backends, 0)
    stalled_jobs = dict.fromkeys(backends, 0)
    stalled: list[tuple[list[str], float, float]] = []
    straggling_jobs = dict.fromkeys(backends, 0)
    straggling: list[tuple[list[str], int]] = []
    idle_gpus: dict[str, int] = {}
    idle_for: list[tuple[list[str], float]] = []
    ranks: dict[str, list[tuple[list[str], float]]] = {name: [] for name in _RANK_FIGURES}
    for job in jobs:
        by_state[(job.state.value, job.backend)] += 1
        restarts[job.backend] += job.restarts
        if job.state is JobState.QUEUED:
            queued[job.backend].append(max(0.0, now - job.created))
        if job.started is not None:
            admission.setdefault((job.backend,), []).append(max(0.0, job.started - job.created))
        if job.final and job.started is not None and job.finished is not None:
            key = (job.backend, job.state.value)
            durations.setdefault(key, []).append(max(0.0, job.finished - job.started))
        if job.state is JobState.RUNNING and job.gpu_idle_since is not None:
            idle_jobs[job.backend] += 1
        if job.state is JobState.RUNNING and job.stall:
            stalled_jobs[job.backend] += 1
            if not shared:
                labels = [job.id, job.name, job.owner or "", job.backend]
                since = float(job.stall.get("since") or now)
                stalled.append((labels, max(0.0, now - since), len(job.stall.get("ranks") or [])))
        if job.state is JobState.RUNNING and job.straggler:
            straggling_jobs[job.backend] += 1
            if not shared:
                labels = [job.id, job.name, job.owner or "", job.backend]
                straggling.append((labels, len(job.straggler.get("ranks") or [])))
        if job.state is JobState.RUNNING and not shared:
            owner = job.owner or ""
            held = job.spec.workers * job.spec.gpus_per_worker
            user_gpus[owner] = user_gpus.get(owner, 0) + held
            if job.gpu_idle_since is not None:
                idle_gpus[owner] = idle_gpus.get(owner, 0) + held
                labels = [job.id, job.name, owner, job.backend]
                idle_for.append((labels, max(0.0, now - job.gpu_idle_since)))
            for rank in job.ranks:
                labels = [job.id, job.name, owner, job.backend, str(rank.rank)]
                for name, figure in _RANK_FIGURES.items():
                    value = (rank.metrics or {}).get(figure)
                    if isinstance(value, (int, float)):
                        ranks[name].append((labels, float(value)))

    def gauge(name: str, labels: list[str] | None = None) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, SERIES[name][1], labels=labels or [])

    out: list[Metric] = []
    family = gauge("mlcluster_jobs", ["state", "backend"])
    for (state, backend), count in sorted(by_state.items()):
        family.add_metric([state, backend], count)
    out.append(family)
    length = gauge("mlcluster_queue_length", ["backend"])
    oldest = gauge("mlcluster_queue_oldest_wait_seconds", ["backend"])
    for backend, waits in queued.items():
        length.add_metric([backend], len(waits))
        oldest.add_metric([backend], max(waits, default=0.0))
    out += [length, oldest]
    out.append(
        _histogram("mlcluster_job_admission_seconds", ["backend"], admission, ADMISSION_BUCKETS)
    )
    out.append(
        _histogram(
            "mlcluster_job_duration_seconds", ["backend", "state"], durations, DURATION_BUCKETS
        )
    )
    restart_counts = CounterMetricFamily(
        "mlcluster_job_restarts", SERIES["mlcluster_job_restarts"][1], labels=["backend"]
    )
    for backend, count in restarts.items():
        restart_counts.add_metric([backend], count)
    out.append(restart_counts)
    if cluster is not None:
        backend = [cluster["backend"]]
        capacity = cluster.get("capacity") or {}
        gpus, cpus = capacity.get("gpus") or {}, capacity.get("cpus") or {}
        for name, value in (
            ("mlcluster_gpus_capacity", gpus.get("total")),
            ("mlcluster_gpus_allocated", _used(gpus)),
            ("mlcluster_cpu_slots_capacity", cpus.get("total")),
            ("mlcluster_cpu_slots_allocated", _used(cpus)),
        ):
            if value is not None:
                family = gauge(name, ["backend"])
                family.add_metric(backend, value)
                out.append(family)
    family = gauge("mlcluster_user_gpus_allocated", ["owner"])
    for owner, count in sorted(user_gpus.items()):
        family.add_metric([owner], count)
    out.append(family)
    for name, samples in ranks.items():
        family = gauge(name, ["job", "name", "owner", "backend", "rank"])
        for labels, value in samples:
            family.add_metric(labels, value)
        out.append(family)
    family = gauge("mlcluster_idle_gpu_jobs", ["backend"])
    for backend, count in idle_jobs.items():
        family.add_metric([backend], count)
    out.append(family)
    family = gauge("mlcluster_idle_gpus", ["owner"])
    for owner, count in sorted(idle_gpus.items()):
        family.add_metric([owner], count)
    out.append(family)
    family = gauge("mlcluster_job_gpu_idle_seconds", ["job", "name", "owner", "backend"])
    for labels, value in idle_for:
        family.add_metric(labels, value)
    out.append(family)
    family = gauge("mlcluster_stalled_jobs", ["backend"])
    for backend, count in stalled_jobs.items():
        family.add_metric([backend], count)
    out.append(family)
    for name, seconds in (
        ("mlcluster_job_stalled_ranks", False),
        ("mlcluster_job_stalled_seconds", True),
    ):
        family = gauge(name, ["job", "name", "owner", "backend"])
        for labels, age, stalled_ranks in stalled:
            family.add_metric(labels, age if seconds else stalled_ranks)
        out.append(family)
    family = gauge("mlcluster_straggling_jobs", ["backend"])
    for backend, count in straggling_jobs.items():
        family.add_metric([backend], count)
    out.append(family)
    family = gauge("mlcluster_job_straggler_ranks", ["job", "name", "owner", "backend"])
    for labels, count in straggling:
        family.add_metric(labels, count)
    out.append(family)
    family = gauge("mlcluster_metrics_snapshot_timestamp_seconds")
    family.add_metric([], now)
    out.append(family)
    return out


def _used(figure: dict[str, Any]) -> float | None:
    total, free = figure.get("total"), figure.get("free")
    if total is None or free is None:
        return None
    return max(0, total - free)


@dataclasses.dataclass
class MetricsSnapshot:
    families: list[Metric]
    taken: float


class SnapshotCollector:
    """What the registry calls on each scrape: yields the newest snapshot, reads nothing."""

    def __init__(self) -> None:
        self.snapshot = MetricsSnapshot([], 0.0)

    def collect(self) -> Iterable[Metric]:
        return list(self.snapshot.families)

    def describe(self) -> list[Metric]:
        # Nothing up front: the families exist once the first snapshot is read, and the
        # registry then need not call collect() (a store read) to learn their names.
        return []


class ServerMetrics:
    """Rebuilds the snapshot in the executor every `interval` seconds while the server runs."""

    def __init__(
        self,
        read: Callable[[], tuple[list[JobRecord], dict[str, Any] | None]],
        run: Callable[..., Any],
        interval: float,
        registry=REGISTRY,
        *,
        shared: bool = False,
    ) -> None:
        self._read = read
        self.shared = shared
        self._run = run
        self.interval = interval
        self.registry = registry
        self.collector = SnapshotCollector()
        self._task: asyncio.Task | None = None

    def refresh_now(self) -> None:
        """Read the store and cluster once (blocking: call it in the executor)."""
        jobs, cluster = self._read()
        now = time.time()
        self.collector.snapshot = MetricsSnapshot(
            build_metrics(jobs, cluster, now, shared=self.shared), now
        )

    def start(self) -> None:
        if self.interval <= 0:
            return
        self.registry.register(self.collector)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        failures = 0
        while True:
            try:
                await self._run(self.refresh_now)
                failures = 0
            except Exception:  # keep serving the last snapshot
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.exception("mlcluster: reading metrics failed (%d in a row)", failures)
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
            with contextlib.suppress(KeyError):
                self.registry.unregister(self.collector)
