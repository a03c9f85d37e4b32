"""A Kubernetes job's logs, inside its supervisor (supervise.py's `_Attempt`): one log stream
per pod (re-opened with LOG_BACKOFF when it ends early), its lines split into ranks' lines and
control records (progress, errors, rank 0's result in signed chunks, written to the job's
directory), and the drain of the last lines after the outcome."""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from ... import kubeconn
from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.model import RankState
from .client import message_of
from .logs import PodLogFollower, PodOutput
from .objects import pod_ranks
from .status import container_phase

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

LOOP_TICK = 0.05
LOG_DRAIN_TIMEOUT = 10.0  # after the outcome: how long to wait for the last log lines
# Before re-opening a log stream that ended early or failed: the one policy, with a lower cap
# so that lines written during an outage are read before the drain after the outcome ends.
LOG_BACKOFF = kubeconn.Backoff(first=kubeconn.backoff_from_env().first, cap=10.0)
LOG_FAILURES_REPORTED = 3  # failures in a row before the user hears of it


def write_atomically(path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


if TYPE_CHECKING:
    from .supervise import _Attempt


def ensure_log_streams(attempt: _Attempt) -> None:
    now = time.monotonic()
    for name, pod in attempt.pods.items():
        if name in attempt.followers or name in attempt.log_done or not attempt._mine(pod):
            continue
        if (
            attempt.log_retry_at.get(name, 0.0) > now
            or container_phase(pod, attempt.container) == "waiting"
        ):
            continue
        ranks = pod_ranks(pod, attempt.plan.engine, attempt.plan.ranks_per_pod)
        if not ranks:
            continue
        skip = attempt.resume_skip.pop(name, None)
        if skip is None:
            skip = {r: attempt.adopted_skip.get(r, 0) for r in ranks}
        attempt.outputs[name] = PodOutput(ranks, skip, key=attempt.run_.key)
        attempt.followers[name] = PodLogFollower(
            attempt.run_.conn, attempt.plan.namespace, name, attempt.container, attempt.events
        ).start()


def log_ended(attempt: _Attempt, pod_name: str, error: BaseException | None) -> None:
    attempt.followers.pop(pod_name, None)
    output = attempt.outputs.pop(pod_name, None)
    if output is None:
        return
    for rank, kind, value in output.finish():
        attempt.rank_item(rank, kind, value)
    pod = attempt.pods.get(pod_name)
    if pod is None or (error is None and container_phase(pod, attempt.container) == "terminated"):
        attempt.log_done.add(pod_name)
        return
    # Ended early (a dropped connection, or our view of the pod is behind): read it
    # again later, skipping what we already have.
    attempt.resume_skip[pod_name] = output.seen()
    failures = attempt.log_failures[pod_name] = attempt.log_failures.get(pod_name, 0) + (
        error is not None
    )
    if failures == LOG_FAILURES_REPORTED and error is not None:
        attempt.ctx.logs.system(
            f"[mlcluster] cannot read the log of pod {pod_name}: {message_of(error)}"
        )
    delay = LOG_BACKOFF.delay(failures, getattr(error, "retry_after", None))
    attempt.log_retry_at[pod_name] = time.monotonic() + delay


def rank_item(attempt: _Attempt, rank: int, kind: str, value: Any) -> None:
    if kind == "line":
        attempt.ctx.logs.line(rank, "o", value)
    elif kind == "progress":
        attempt._rank_update(rank, {"progress": lifecycle.clean_progress(value)})
    elif kind == "control":
        control(attempt, rank, value)


def control(attempt: _Attempt, rank: int, record: dict[str, Any]) -> None:
    rtype = record.get("type")
    job_id = attempt.ctx.job.id
    if rtype == "started":
        attempt.started_ranks.add(rank)
        state = attempt.written.get(rank, {}).get("state", RankState.PENDING)
        if not RankState(state).final:
            attempt._rank_update(rank, {"state": RankState.RUNNING})
    elif rtype == "progress":
        attempt._rank_update(rank, {"progress": lifecycle.clean_progress(record)})
    elif rtype == "metrics":
        attempt.runtime_metrics[rank] = {
            k: record.get(k)
            for k in ("cpu_percent", "memory_bytes", "gpu_util", "gpu_memory_bytes")
        }
    elif rtype == "error":
        report = {k: v for k, v in record.items() if k != "type"}
        write_atomically(attempt.ctx.store.error_path(job_id, rank), json.dumps(report).encode())
    elif rtype == "result" and rank == 0:  # a result comes from rank 0 or from nobody
        result_chunk(attempt, record)
    elif rtype == "packages":  # the pod installs the notebook's packages (its log says more)
        if record.get("state") == "installing":
            attempt.installing.add(rank)
        else:
            attempt.installing.discard(rank)


def result_chunk(attempt: _Attempt, record: dict[str, Any]) -> None:
    """Rank 0's result in chunks: the pickle (its owner's kernel reads it) and its JSON
    form (what servers serve); neither is ever loaded here. More than the job's result cap
    is dropped as it comes (a pod cannot fill this process's memory) and fails the job."""
    if attempt.result_refused:
        return
    form = "json" if record.get("form") == "json" else "pickle"
    if form == "json" and attempt.json_form_refused:
        return
    chunks = attempt.result_chunks.setdefault(form, {})
    try:
        index, count = int(record["index"]), int(record["count"])
        data = str(record["data"])
    except (KeyError, TypeError, ValueError):
        return
    attempt.result_received += len(data) - len(chunks.get(index, ""))
    chunks[index] = data
    json_cap = attempt.ctx.config.max_result_json_mib * 1024 * 1024
    if form == "json" and json_cap:
        held = sum(len(c) for c in chunks.values())
        if held > json_cap * 4 // 3 + 4:
            # The JSON form is what servers read and serve, for everyone: it is kept small
            # whatever the rank says of itself. The job and its pickle go on.
            attempt.result_received -= held
            del attempt.result_chunks[form]
            attempt.json_form_refused = True
            why = (
                f"its JSON form is more than this job's supervisor keeps ({json_cap >> 20} "
                "MiB, MLClusterConfig.max_result_json_mib)"
            )
            attempt.ctx.logs.system(f"[mlcluster] rank 0's result: {why}", rank=0)
            write_atomically(
                attempt.ctx.store.result_json_path(attempt.ctx.job.id),
                json.dumps({"kind": "refused", "refused": why}).encode(),
            )
            return
    limit = attempt.ctx.config.max_result_mib * 1024 * 1024
    # base64 is 4/3 of the bytes; the JSON form may be as big as the pickle.
    if limit and attempt.result_received > 2 * (limit * 4 // 3 + 4):
        attempt.result_chunks = {}
        attempt.result_refused = (
            f"rank 0's result is more than this job may return ({limit // (1024 * 1024)} "
            "MiB, MLClusterConfig.max_result_mib): save it to a file instead"
        )
        attempt.ctx.logs.system(f"[mlcluster] {attempt.result_refused}", rank=0)
        return
    if 0 <= index < count <= len(chunks) and all(i in chunks for i in range(count)):
        result = base64.b64decode("".join(chunks[i] for i in range(count)))
        store = attempt.ctx.store
        path = store.result_json_path if form == "json" else store.result_path
        write_atomically(path(attempt.ctx.job.id), result)
        attempt.result_received -= sum(len(c) for c in chunks.values())
        del attempt.result_chunks[form]


def drain_logs(attempt: _Attempt, outcome: Outcome) -> None:
    """The outcome is known; wait (a little) for the log lines that tell its story: all
    ranks' after a success (rank 0's result), the failing pod's after a failure."""
    if outcome.kind == OutcomeKind.SUCCEEDED:
        wanted = {n for n, p in attempt.pods.items() if attempt._mine(p)}
    elif outcome.kind == OutcomeKind.FAILED and outcome.failed_pod:
        wanted = {outcome.failed_pod}
    else:
        wanted = set()
    deadline = time.monotonic() + LOG_DRAIN_TIMEOUT
    while True:
        waiting = {
            n
            for n in wanted
            if n in attempt.followers
            or (
                n not in attempt.log_done
                and n in attempt.pods
                and container_phase(attempt.pods[n], attempt.container) != "waiting"  # no logs ever
            )
        }
        if not waiting or time.monotonic() > deadline:
            break
        ensure_log_streams(attempt)
        attempt._pump(LOOP_TICK)
        attempt.ctx.tick()
    if attempt.result_chunks:
        attempt.ctx.logs.system("[mlcluster] rank 0's result did not arrive completely", rank=0)
    attempt._flush(force=True)


def blame_packed_rank(attempt: _Attempt, outcome: Outcome) -> None:
    """In a pod of several ranks, the failing one is the one that reported an error."""
    pod = attempt.pods.get(outcome.failed_pod or "")
    if pod is None or attempt.plan.ranks_per_pod == 1:
        return
    for rank in pod_ranks(pod, attempt.plan.engine, attempt.plan.ranks_per_pod):
        if attempt.ctx.store.error_path(attempt.ctx.job.id, rank).exists():
            outcome.failed_rank = rank
            return
