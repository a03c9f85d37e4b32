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
    tally = _Tally(backends, now, shared)
    for job in jobs:
        tally.add(job)
    return tally.families(cluster)


def _gauge(name: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, SERIES[name][1], labels=labels or [])


def _by_label(name: str, labels: list[str], samples: Iterable[tuple[list[str], float]]) -> Metric:
    family = _gauge(name, labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _by_backend(name: str, counts: dict[str, int]) -> Metric:
    return _by_label(name, ["backend"], (([backend], n) for backend, n in counts.items()))


def _by_owner(name: str, counts: dict[str, int]) -> Metric:
    return _by_label(name, ["owner"], (([owner], n) for owner, n in sorted(counts.items())))


_JOB_LABELS = ["job", "name", "owner", "backend"]


class _Tally:
    """The figures of one snapshot, counted job by job, then laid out as SERIES' families."""

    def __init__(self, backends: list[str], now: float, shared: bool) -> None:
        self.now, self.shared = now, shared
        self.by_state = {(s.value, b): 0 for s in JobState for b in backends}
        self.queued: dict[str, list[float]] = {b: [] for b in backends}
        self.admission: dict[tuple[str, ...], list[float]] = {}
        self.durations: dict[tuple[str, ...], list[float]] = {}
        self.restarts = dict.fromkeys(backends, 0)
        self.user_gpus: dict[str, int] = {}
        self.idle_jobs = dict.fromkeys(backends, 0)
        self.stalled_jobs = dict.fromkeys(backends, 0)
        self.stalled: list[tuple[list[str], float, float]] = []
        self.straggling_jobs = dict.fromkeys(backends, 0)
        self.straggling: list[tuple[list[str], float]] = []
        self.idle_gpus: dict[str, int] = {}
        self.idle_for: list[tuple[list[str], float]] = []
        self.ranks: dict[str, list[tuple[list[str], float]]] = {n: [] for n in _RANK_FIGURES}

    def add(self, job: JobRecord) -> None:
        now = self.now
        self.by_state[(job.state.value, job.backend)] += 1
        self.restarts[job.backend] += job.restarts
        if job.state is JobState.QUEUED:
            self.queued[job.backend].append(max(0.0, now - job.created))
        if job.started is not None:
            admitted = max(0.0, job.started - job.created)
            self.admission.setdefault((job.backend,), []).append(admitted)
        if job.final and job.started is not None and job.finished is not None:
            key = (job.backend, job.state.value)
            self.durations.setdefault(key, []).append(max(0.0, job.finished - job.started))
        if job.state is JobState.RUNNING:
            self._running(job)

    def _running(self, job: JobRecord) -> None:
        now, shared = self.now, self.shared
        labels = [job.id, job.name, job.owner or "", job.backend]
        if job.gpu_idle_since is not None:
            self.idle_jobs[job.backend] += 1
        if job.stall:
            self.stalled_jobs[job.backend] += 1
            if not shared:
                since = float(job.stall.get("since") or now)
                stalled_ranks = len(job.stall.get("ranks") or [])
                self.stalled.append((labels, max(0.0, now - since), stalled_ranks))
        if job.straggler:
            self.straggling_jobs[job.backend] += 1
            if not shared:
                self.straggling.append((labels, len(job.straggler.get("ranks") or [])))
        if not shared:
            self._held(job, labels)

    def _held(self, job: JobRecord, labels: list[str]) -> None:
        """The GPUs a running job holds, whether idle, and its ranks' figures (per job and
        owner: not on a shared server)."""
        owner = job.owner or ""
        held = job.spec.workers * job.spec.gpus_per_worker
        self.user_gpus[owner] = self.user_gpus.get(owner, 0) + held
        if job.gpu_idle_since is not None:
            self.idle_gpus[owner] = self.idle_gpus.get(owner, 0) + held
            self.idle_for.append((labels, max(0.0, self.now - job.gpu_idle_since)))
        for rank in job.ranks:
            rank_labels = [*labels, str(rank.rank)]
            for name, figure in _RANK_FIGURES.items():
                value = (rank.metrics or {}).get(figure)
                if isinstance(value, (int, float)):
                    self.ranks[name].append((rank_labels, float(value)))

    def families(self, cluster: dict[str, Any] | None) -> list[Metric]:
        out = self._job_families()
        if cluster is not None:
            out += _capacity_families(cluster)
        out.append(_by_owner("mlcluster_user_gpus_allocated", self.user_gpus))
        for name, samples in self.ranks.items():
            out.append(_by_label(name, [*_JOB_LABELS, "rank"], samples))
        out += self._health_families()
        family = _gauge("mlcluster_metrics_snapshot_timestamp_seconds")
        family.add_metric([], self.now)
        out.append(family)
        return out

    def _job_families(self) -> list[Metric]:
        states = _gauge("mlcluster_jobs", ["state", "backend"])
        for (state, backend), count in sorted(self.by_state.items()):
            states.add_metric([state, backend], count)
        length = _gauge("mlcluster_queue_length", ["backend"])
        oldest = _gauge("mlcluster_queue_oldest_wait_seconds", ["backend"])
        for backend, waits in self.queued.items():
            length.add_metric([backend], len(waits))
            oldest.add_metric([backend], max(waits, default=0.0))
        restarts = CounterMetricFamily(
            "mlcluster_job_restarts", SERIES["mlcluster_job_restarts"][1], labels=["backend"]
        )
        for backend, count in self.restarts.items():
            restarts.add_metric([backend], count)
        return [
            states,
            length,
            oldest,
            _histogram(
                "mlcluster_job_admission_seconds", ["backend"], self.admission, ADMISSION_BUCKETS
            ),
            _histogram(
                "mlcluster_job_duration_seconds",
                ["backend", "state"],
                self.durations,
                DURATION_BUCKETS,
            ),
            restarts,
        ]

    def _health_families(self) -> list[Metric]:
        """Idle GPUs, stalled and straggling jobs."""
        out = [
            _by_backend("mlcluster_idle_gpu_jobs", self.idle_jobs),
            _by_owner("mlcluster_idle_gpus", self.idle_gpus),
            _by_label("mlcluster_job_gpu_idle_seconds", _JOB_LABELS, self.idle_for),
            _by_backend("mlcluster_stalled_jobs", self.stalled_jobs),
        ]
        for name, seconds in (
            ("mlcluster_job_stalled_ranks", False),
            ("mlcluster_job_stalled_seconds", True),
        ):
            samples = ((labels, age if seconds else n) for labels, age, n in self.stalled)
            out.append(_by_label(name, _JOB_LABELS, samples))
        out.append(_by_backend("mlcluster_straggling_jobs", self.straggling_jobs))
        out.append(_by_label("mlcluster_job_straggler_ranks", _JOB_LABELS, self.straggling))
        return out


def _capacity_families(cluster: dict[str, Any]) -> list[Metric]:
    backend = [cluster["backend"]]
    capacity = cluster.get("capacity") or {}
    gpus, cpus = capacity.get("gpus") or {}, capacity.get("cpus") or {}
    out: list[Metric] = []
    for name, value in (
        ("mlcluster_gpus_capacity", gpus.get("total")),
        ("mlcluster_gpus_allocated", _used(gpus)),
        ("mlcluster_cpu_slots_capacity", cpus.get("total")),
        ("mlcluster_cpu_slots_allocated", _used(cpus)),
    ):
        if value is not None:
            family = _gauge(name, ["backend"])
            family.add_metric(backend, value)
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
