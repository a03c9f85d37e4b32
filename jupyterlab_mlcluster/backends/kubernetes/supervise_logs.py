"""A Kubernetes job's logs, inside its supervisor (supervise.py's `_Attempt`): one log stream
per pod (re-opened with LOG_BACKOFF when it ends early), its lines split into ranks' lines and
control records (progress, errors, rank 0's result in signed chunks, written to the job's
directory), and the drain of the last lines after the outcome."""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from ... import kubeconn
from ...jobs import lifecycle
from ...jobs.lifecycle import Outcome, OutcomeKind
from ...jobs.model import RankState
from ...runtime.atomic import write_whole
from ...runtime.outcome import RESULT_CHUNK
from .client import message_of
from .logs import MAX_POD_LINE, PodLogFollower, PodOutput
from .objects import pod_ranks
from .status import container_phase

log = logging.getLogger("jupyterlab_mlcluster.supervisor")

LOOP_TICK = 0.05
LOG_DRAIN_TIMEOUT = 10.0  # after the outcome: how long to wait for the last log lines
# Before re-opening a log stream that ended early or failed: the one policy, with a lower cap
# so that lines written during an outage are read before the drain after the outcome ends.
LOG_BACKOFF = kubeconn.Backoff(first=kubeconn.backoff_from_env().first, cap=10.0)
LOG_FAILURES_REPORTED = 3  # failures in a row before the user hears of it


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
        attempt.forensics.active(rank)
    elif kind == "progress":
        attempt._rank_update(rank, {"progress": lifecycle.clean_progress(value)})
        attempt.forensics.active(rank)
    elif kind == "control":
        control(attempt, rank, value)
    elif kind == "unread":  # a report over MAX_POD_LINE, cut short: dropped, said once
        attempt.ctx.logs.unread_record(rank, over=f"{MAX_POD_LINE >> 20} MiB")


def control(attempt: _Attempt, rank: int, record: dict[str, Any]) -> None:
    rtype = record.get("type")
    job_id = attempt.ctx.job.id
    if rtype == "started":
        attempt.started_ranks.add(rank)
        attempt.forensics.active(rank)
        state = attempt.written.get(rank, {}).get("state", RankState.PENDING)
        if not RankState(state).final:
            attempt._rank_update(rank, {"state": RankState.RUNNING})
    elif rtype == "progress":
        attempt._rank_update(rank, {"progress": lifecycle.clean_progress(record)})
        attempt.forensics.active(rank)
    elif rtype == "stacks_port":  # where its stack helper listens (forensics.py)
        attempt.forensics.port(rank, record.get("port"))
    elif rtype == "failing":  # its code raised; it waits while its peers are read
        attempt.forensics.on_failing(rank)
    elif rtype == "metrics":
        attempt.runtime_metrics[rank] = {
            k: record.get(k)
            for k in ("cpu_percent", "memory_bytes", "gpu_util", "gpu_memory_bytes")
        }
    elif rtype == "error":
        report = {k: v for k, v in record.items() if k != "type"}
        write_whole(attempt.ctx.store.error_path(job_id, rank), json.dumps(report).encode())
    elif rtype == "result" and rank == 0:  # a result comes from rank 0 or from nobody
        result_chunk(attempt, record)
    elif rtype == "packages":  # the pod installs the notebook's packages (its log says more)
        if record.get("state") == "installing":
            attempt.installing.add(rank)
        else:
            attempt.installing.discard(rank)


# What each chunk held counts for besides its data: an empty chunk is not free (a dict entry,
# its index, its string; about 100 bytes), so its count is what bounds how many are held.
CHUNK_ENTRY = 64


def result_chunk(attempt: _Attempt, record: dict[str, Any]) -> None:
    """Rank 0's result in chunks: the pickle (its owner's kernel reads it) and its JSON
    form (what servers serve); neither is ever loaded here. More than the job's result cap
    is dropped as it comes (a pod cannot fill this process's memory) and fails the job.
    A sending's chunk 0 fixes how many chunks it has (at most what the cap allows, at the
    runtime's RESULT_CHUNK each); a chunk past that number, or saying another, refuses the
    result, and a chunk before any chunk 0 is dropped: what is held stays within the
    count, empty chunks included."""
    if attempt.result_refused:
        return
    form = "json" if record.get("form") == "json" else "pickle"
    if form == "json" and attempt.json_form_refused:
        return
    try:
        index, count = int(record["index"]), int(record["count"])
        data = str(record["data"])
    except (KeyError, TypeError, ValueError):
        return
    config = attempt.ctx.config
    cap = (config.max_result_json_mib if form == "json" else config.max_result_mib) << 20
    if index == 0 and count != attempt.result_counts.get(form):
        # A sending starts with its chunk 0 (a restarted rank 0 sends its result again).
        _forget(attempt, form)
        attempt.result_counts[form] = count
    expected = attempt.result_counts.get(form)
    if expected is None:
        return
    if count != expected or not 0 <= index < count:
        why = (
            f"its chunks disagree on their number (chunk {index} of {count}, after a chunk 0 "
            f"of {expected})"
        )
        _refuse(attempt, form, why)
        return
    if cap and count > -(-(cap * 4 // 3 + 4) // RESULT_CHUNK):
        _over_cap(attempt, form)
        return
    chunks = attempt.result_chunks.setdefault(form, {})
    previous = chunks.get(index)
    attempt.result_received += len(data) + (CHUNK_ENTRY if previous is None else -len(previous))
    chunks[index] = data
    if form == "json" and cap:
        held_json = sum(len(c) + CHUNK_ENTRY for c in chunks.values())
        if held_json > cap * 4 // 3 + 4:
            _over_cap(attempt, form)
            return
    limit = config.max_result_mib << 20
    # base64 is 4/3 of the bytes; the JSON form may be as big as the pickle.
    if limit and attempt.result_received > 2 * (limit * 4 // 3 + 4):
        _over_cap(attempt, "pickle")
        return
    if len(chunks) == count:  # every index below count: each was checked as it came
        result = base64.b64decode("".join(chunks[i] for i in range(count)))
        store = attempt.ctx.store
        path = store.result_json_path if form == "json" else store.result_path
        write_whole(path(attempt.ctx.job.id), result)
        _forget(attempt, form)


def _forget(attempt: _Attempt, form: str) -> None:
    chunks = attempt.result_chunks.pop(form, {})
    attempt.result_received -= sum(len(c) + CHUNK_ENTRY for c in chunks.values())
    attempt.result_counts.pop(form, None)


def _over_cap(attempt: _Attempt, form: str) -> None:
    if form == "json":
        # The JSON form is what servers read and serve, for everyone: it is kept small
        # whatever the rank says of itself. The job and its pickle go on.
        why = (
            "its JSON form is more than this job's supervisor keeps "
            f"({attempt.ctx.config.max_result_json_mib} MiB, MLClusterConfig.max_result_json_mib)"
        )
    else:
        why = (
            f"rank 0's result is more than this job may return "
            f"({attempt.ctx.config.max_result_mib} MiB, MLClusterConfig.max_result_mib): save "
            "it to a file instead"
        )
    _refuse(attempt, form, why)


def _refuse(attempt: _Attempt, form: str, why: str) -> None:
    """Drop what is held of the result (the JSON form alone: the job goes on; the pickle:
    the job fails saying why)."""
    if form == "json":
        _forget(attempt, form)
        attempt.json_form_refused = True
        attempt.ctx.logs.system(f"[mlcluster] rank 0's result: {why}", rank=0)
        write_whole(
            attempt.ctx.store.result_json_path(attempt.ctx.job.id),
            json.dumps({"kind": "refused", "refused": why}).encode(),
        )
        return
    for held in list(attempt.result_chunks):
        _forget(attempt, held)
    attempt.result_refused = why if why.startswith("rank 0") else f"rank 0's result: {why}"
    attempt.ctx.logs.system(f"[mlcluster] {attempt.result_refused}", rank=0)


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
