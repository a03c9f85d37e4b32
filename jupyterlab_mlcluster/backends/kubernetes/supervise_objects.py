"""A Kubernetes job's objects, inside its supervisor (supervise.py's `_Attempt`): create them
(the job object suspended, its owned Secrets/Service/PodGroup, then resume) or adopt them
when a new supervisor takes over; the payload Secrets trusted by the uid recorded when
created, and checked again before resume; at the end, delete with foreground propagation
and wait until the job object and its pods are gone, and settle the ranks' states."""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from ... import kubeconn
from ...jobs.lifecycle import Outcome
from ...jobs.model import RankState
from ...runtime.atomic import write_whole
from ...runtime.sync_packages import describe
from . import supervise_logs
from .cleanup import pending_cleanup, set_pending_cleanup
from .client import KubeError, is_already_exists, kind_of, message_of, with_retries
from .logs import stored_line_counts
from .objects import ANNOTATION_ATTEMPT, job_selector, with_owner
from .packages import PackageSync
from .payload import split_payload
from .plan import plan_objects
from .status import is_suspended, owned_by
from .supervise_logs import LOOP_TICK

log = logging.getLogger("jupyterlab_mlcluster.supervisor")
DELETE_FAILURES = kubeconn.FailureLog(log)

DEPENDENT_RETRY_TIMEOUT = 30.0  # for a same-named leftover of an earlier attempt to be collected
VERIFY_GONE_INTERVAL = 2.0

if TYPE_CHECKING:
    from .supervise import _Attempt


def create_or_adopt(attempt: _Attempt) -> None:
    run, ctx, plan = attempt.run_, attempt.ctx, attempt.plan
    existing = with_retries(lambda: run.res.get(run.kind, run.name), f"get {run.name}")
    if existing is not None and not ours(attempt, existing):
        if pending_cleanup(ctx.job) is not None:
            # An earlier supervisor of this very attempt was deleting it: the outcome
            # is not known, and running the job again is not ours to decide.
            raise KubeError(
                f"{plan.kind} {run.name} was being deleted when the job's supervisor died"
            )
        wait_gone(attempt, existing)
        existing = None
    if existing is not None:
        attempt.adopted_skip = stored_line_counts(ctx.store, ctx.job.id, attempt.spec.workers)
        ctx.logs.system(f"[mlcluster] supervisor restarted: following {plan.kind} {run.name} again")
        job = existing
    else:
        job = None
    objects = plan_objects(
        plan,
        ctx.job.id,
        attempt.spec,
        user=ctx.job.owner or "unknown",
        payload_chunks=split_payload(ctx.store.payload_path(ctx.job.id).read_bytes()),
        attempt=attempt.number,
        report_key=run.key,
        # An eviction or deletion gives the ranks the job's grace, as a cancel does.
        grace=ctx.config.kill_grace_period,
    )
    if job is None:
        log.debug("creating %s %s", plan.kind, run.name)
        job = create(attempt, objects.job)
        if attempt.number == 0:
            say_packages(attempt)
    attempt.job, attempt.uid = job, job["metadata"]["uid"]
    for dependent in objects.dependents:
        create_dependent(attempt, with_owner(dependent, job))
    check_secrets(attempt, objects.dependents)
    if objects.resume is not None and is_suspended(job, plan.engine):
        attempt.job = with_retries(resume(attempt, objects.resume), f"resume {run.name}")
    log.debug("objects ready")


def say_packages(attempt: _Attempt) -> None:
    """What the pods will install first (the notebook's packages), and any caveat."""
    sync = PackageSync.from_dict(attempt.plan.packages)
    if sync is None or not sync.requirements:
        return
    source = "the wheel cache" if sync.cache_claim else "the package index"
    attempt.ctx.logs.system(
        f"[mlcluster] each pod first installs {describe(list(sync.requirements))}, "
        f"installed in the notebook since its pod started, from {source} "
        "(--no-sync-packages: not)"
    )
    for note in sync.notes:
        attempt.ctx.logs.system(f"[mlcluster] {note}")


def ours(attempt: _Attempt, obj: dict[str, Any]) -> bool:
    """This attempt's object, alive (adopt it), not an earlier attempt's or one being
    deleted."""
    meta = obj.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (meta.get("annotations") or {}).get(
        ANNOTATION_ATTEMPT
    ) == str(attempt.number)


def create(attempt: _Attempt, obj: dict[str, Any]) -> dict[str, Any]:
    res = attempt.run_.res

    def create() -> dict[str, Any]:
        try:
            return res.create(obj)
        except Exception as exc:
            if is_already_exists(exc):  # our own earlier try went through after all
                found = res.get(kind_of(obj), obj["metadata"]["name"])
                if found is not None and ours(attempt, found):
                    return found
            raise

    return with_retries(create, f"create {obj['kind']} {obj['metadata']['name']}")


def create_dependent(attempt: _Attempt, obj: dict[str, Any]) -> None:
    """Create an owned object; a same-named one of ours is fine, a leftover of an earlier
    attempt (another owner, being garbage-collected) is waited out."""
    res, kind, name = attempt.run_.res, kind_of(obj), obj["metadata"]["name"]
    deadline = time.monotonic() + DEPENDENT_RETRY_TIMEOUT
    while True:
        try:
            created = with_retries(lambda: res.create(obj), f"create {obj['kind']} {name}")
            if kind.kind == "Secret":
                record_secret(attempt, name, created["metadata"]["uid"])
            return
        except Exception as exc:
            if not is_already_exists(exc):
                raise
        if kind.kind == "Secret":
            # Ours only if this job's supervisor recorded creating it (one that died
            # mid-way did); else someone else's, holding who knows what code.
            if name in secret_uids(attempt):
                return
            raise KubeError(
                f"Secret {name} already exists and was not created by this job: "
                "refusing to run the code it holds"
            )
        found = res.get(kind, name)
        if found is not None and owned_by(found, attempt.uid or ""):
            return
        if time.monotonic() > deadline:
            raise KubeError(f"{obj['kind']} {name} exists and belongs to something else")
        time.sleep(0.2)


def secrets_file(attempt: _Attempt):
    return attempt.ctx.store.job_dir(attempt.ctx.job.id) / "payload-secrets.json"


def secret_uids(attempt: _Attempt) -> dict[str, str]:
    """name -> uid of every payload Secret this job's supervisors created."""
    try:
        return json.loads(secrets_file(attempt).read_text())
    except (OSError, ValueError):
        return {}


def record_secret(attempt: _Attempt, name: str, uid: str) -> None:
    uids = secret_uids(attempt)
    uids[name] = uid
    write_whole(secrets_file(attempt), json.dumps(uids).encode())


def check_secrets(attempt: _Attempt, dependents: list[dict[str, Any]]) -> None:
    """Before any pod mounts them: each payload Secret is still the one created here
    (same uid; a deleted-and-recreated one is not). Asked as a dry-run delete with a uid
    precondition, so the runner needs no right to read Secrets."""
    uids = secret_uids(attempt)
    for obj in dependents:
        if obj["kind"] != "Secret":
            continue
        name = obj["metadata"]["name"]
        uid = uids.get(name)
        if uid is None or not with_retries(
            functools.partial(holds_secret, attempt, name, uid), f"check Secret {name}"
        ):
            raise KubeError(
                f"Secret {name} is no longer the one this job created: refusing to run "
                "the code it holds"
            )


def holds_secret(attempt: _Attempt, name: str, uid: str) -> bool:
    return attempt.run_.res.holds(kind_of("v1", "Secret"), name, uid)


def resume(attempt: _Attempt, patch: dict[str, Any]):
    res, kind, name, engine = (
        attempt.run_.res,
        attempt.run_.kind,
        attempt.run_.name,
        attempt.plan.engine,
    )
    tries = 0

    def resume() -> dict[str, Any]:
        nonlocal tries
        tries += 1
        if tries > 1:  # after a conflict: re-read, someone else may have moved it on
            current = res.get(kind, name)
            if current is None:
                raise KubeError(f"{kind.kind} {name} disappeared before it could start")
            if not is_suspended(current, engine):
                return current
        return res.patch(kind, name, patch)

    return resume


def wait_gone(attempt: _Attempt, obj: dict[str, Any]) -> None:
    """An earlier attempt's object: delete it (if nobody is) and wait until it is gone."""
    res, kind, name = attempt.run_.res, attempt.run_.kind, attempt.run_.name
    if not (obj.get("metadata") or {}).get("deletionTimestamp"):
        with_retries(lambda: res.delete(kind, name), f"delete {kind.kind} {name}")
    deadline = time.monotonic() + attempt.ctx.config.kubernetes_delete_timeout
    while with_retries(lambda: res.get(kind, name), f"get {name}") is not None:
        if time.monotonic() > deadline:
            raise KubeError(f"{kind.kind} {name} of an earlier attempt is still being deleted")
        attempt.ctx.tick()
        time.sleep(0.1)


def delete_and_wait(attempt: _Attempt) -> None:
    """Delete the job object (foreground: its pods, Secrets, Service, PodGroup go first)
    and wait until it and every pod of the job are gone.

    The delete must happen: it is retried with the one backoff policy until the API
    server accepts it, however long that takes. The job records it as a pending cleanup
    first, so if this supervisor dies meanwhile, the next one or the reaper finishes it."""
    run, ctx = attempt.run_, attempt.ctx
    set_pending_cleanup(ctx.store, ctx.job.id, True)
    told = False

    def delete() -> bool:
        nonlocal told
        try:
            return run.res.delete(run.kind, run.name)
        except Exception as exc:
            if kubeconn.retryable(exc) and not told:
                told = True
                ctx.logs.system(
                    f"[mlcluster] cannot delete {run.kind.kind} {run.name} yet "
                    f"({message_of(exc)}); retrying until it is gone"
                )
            raise

    try:
        kubeconn.call(
            delete,
            f"delete {run.kind.kind} {run.name}",
            give_up_after=None,
            sleep=functools.partial(wait_ticking, attempt),
            failures=DELETE_FAILURES,
        )
    except Exception as exc:  # noqa: BLE001 - not retryable (e.g. forbidden): say so
        ctx.logs.system(
            f"[mlcluster] could not delete {run.kind.kind} {run.name}: {message_of(exc)}; "
            "the reaper tries again"
        )
        return
    if told:
        ctx.logs.system(f"[mlcluster] {run.kind.kind} {run.name} deleted")
    deadline = time.monotonic() + ctx.config.kubernetes_delete_timeout
    next_check = time.monotonic() + VERIFY_GONE_INTERVAL
    while time.monotonic() < deadline:
        if (
            not attempt.watches
            or (attempt.job is None and not attempt.pods)
            or time.monotonic() > next_check
        ):
            next_check = time.monotonic() + VERIFY_GONE_INTERVAL
            if gone(attempt):
                set_pending_cleanup(ctx.store, ctx.job.id, False)
                attempt._flush(force=True)
                return
        attempt._pump(LOOP_TICK)
        supervise_logs.ensure_log_streams(attempt)
        attempt._flush()
    # The deletion was accepted: Kubernetes finishes it (the cleanup stays pending for
    # the reaper, which checks that it did).
    ctx.logs.system(
        f"[mlcluster] {run.kind.kind} {run.name} or its pods were still being deleted after "
        f"{ctx.config.kubernetes_delete_timeout:g}s; Kubernetes finishes that on its own"
    )


def wait_ticking(attempt: _Attempt, seconds: float) -> None:
    """Sleep between retries, keeping the heartbeat (this supervisor is alive)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        attempt.ctx.tick()
        time.sleep(min(left, 0.5))


def gone(attempt: _Attempt) -> bool:
    """Ask the API server directly (the watches may be behind or not started); an
    unreachable server means: not known to be gone yet."""
    run = attempt.run_
    try:
        if run.res.get(run.kind, run.name) is not None:
            return False
        pods = run.res.list(kind_of("v1", "Pod"), label_selector=job_selector(attempt.ctx.job.id))
    except KubeError as exc:
        DELETE_FAILURES.failed(f"check that {run.name} is gone", exc)
        return False
    return not pods


def settle_ranks(attempt: _Attempt, outcome: Outcome) -> None:
    """Ranks that did not finish were stopped by us (fail-fast, cancel, timeout)."""
    now = time.time()
    for rank in range(attempt.spec.workers):
        state = RankState(attempt.written.get(rank, {}).get("state", RankState.PENDING))
        if not state.final:
            attempt._rank_update(rank, {"state": RankState.CANCELLED, "finished": now})
    attempt._flush(force=True)
