"""A Kubernetes attempt's objects, inside its supervisor (supervise.py's `_Attempt`): create
them (the job object suspended, its owned Secrets/Service/PodGroup, then resume) or adopt
them when a new supervisor takes over; the payload Secrets trusted by the uid recorded when
created, and checked again before resume; at the end, delete with foreground propagation
and wait until the job object and its pods are gone."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import kubeconn
from ...runtime.atomic import write_whole
from ...runtime.sync_packages import describe
from .cleanup import pending_cleanup, set_pending_cleanup
from .client import KubeError, is_already_exists, kind_of, message_of, with_retries
from .objects import ANNOTATION_ATTEMPT, job_selector, with_owner
from .packages import PackageSync
from .payload import split_payload
from .plan import plan_objects
from .status import is_suspended, owned_by

if TYPE_CHECKING:
    from .supervise import JobRun

log = logging.getLogger("jupyterlab_mlcluster.supervisor")
DELETE_FAILURES = kubeconn.FailureLog(log)

DEPENDENT_RETRY_TIMEOUT = 30.0  # for a same-named leftover of an earlier attempt to be collected
VERIFY_GONE_INTERVAL = 2.0


class AttemptObjects:
    """Attempt `number`'s objects in the cluster: its job object (named `run.name`, of
    `run.kind`), the Secrets, Service and PodGroup it owns, and the payload Secrets' uids
    recorded with the job. `uid`: the job object's, once created or adopted."""

    def __init__(self, run: JobRun, number: int):
        self.run, self.ctx, self.plan, self.number = run, run.ctx, run.plan, number
        self.res, self.kind, self.name = run.res, run.kind, run.name
        self.uid: str | None = None
        self.adopted = False  # a new supervisor follows the attempt's live objects again

    def create_or_adopt(self) -> dict[str, Any]:
        """The attempt's job object, created with what it owns and resumed, or adopted."""
        ctx, plan = self.ctx, self.plan
        existing = with_retries(lambda: self.res.get(self.kind, self.name), f"get {self.name}")
        if existing is not None and not self.ours(existing):
            if pending_cleanup(ctx.job) is not None:
                # An earlier supervisor of this very attempt was deleting it: the outcome
                # is not known, and running the job again is not ours to decide.
                raise KubeError(
                    f"{plan.kind} {self.name} was being deleted when the job's supervisor died"
                )
            self.wait_gone(existing)
            existing = None
        if existing is not None:
            self.adopted = True
            ctx.logs.system(
                f"[mlcluster] supervisor restarted: following {plan.kind} {self.name} again"
            )
        objects = plan_objects(
            plan,
            ctx.job.id,
            self.run.spec,
            user=ctx.job.owner or "unknown",
            payload_chunks=split_payload(ctx.store.payload_path(ctx.job.id).read_bytes()),
            attempt=self.number,
            report_key=self.run.key,
            # An eviction or deletion gives the ranks the job's grace, as a cancel does.
            grace=ctx.config.kill_grace_period,
        )
        job = existing
        if job is None:
            log.debug("creating %s %s", plan.kind, self.name)
            job = self.create(objects.job)
            if self.number == 0:
                self.say_packages()
        self.uid = job["metadata"]["uid"]
        if self.adopted and objects.resume is not None and not is_suspended(job, plan.engine):
            # Resumed by an earlier supervisor, whose last step that was: it had made and
            # checked the dependents first. (A new fleet adopting a thousand jobs makes one
            # call for each, not six.)
            return job
        for dependent in objects.dependents:
            self.create_dependent(with_owner(dependent, job))
        self.check_secrets(objects.dependents)
        if objects.resume is not None and is_suspended(job, plan.engine):
            job = with_retries(self.resume(objects.resume), f"resume {self.name}")
        log.debug("objects ready")
        return job

    def say_packages(self) -> None:
        """What the pods will install first (the notebook's packages), and any caveat."""
        sync = PackageSync.from_dict(self.plan.packages)
        if sync is None or not sync.requirements:
            return
        source = "the wheel cache" if sync.cache_claim else "the package index"
        self.ctx.logs.system(
            f"[mlcluster] each pod first installs {describe(list(sync.requirements))}, "
            f"installed in the notebook since its pod started, from {source} "
            "(--no-sync-packages: not)"
        )
        for note in sync.notes:
            self.ctx.logs.system(f"[mlcluster] {note}")

    def ours(self, obj: dict[str, Any]) -> bool:
        """This attempt's object, alive (adopt it), not an earlier attempt's or one being
        deleted."""
        meta = obj.get("metadata") or {}
        return not meta.get("deletionTimestamp") and (meta.get("annotations") or {}).get(
            ANNOTATION_ATTEMPT
        ) == str(self.number)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = self.res

        def create() -> dict[str, Any]:
            try:
                return res.create(obj)
            except Exception as exc:
                if is_already_exists(exc):  # our own earlier try went through after all
                    found = res.get(kind_of(obj), obj["metadata"]["name"])
                    if found is not None and self.ours(found):
                        return found
                raise

        return with_retries(create, f"create {obj['kind']} {obj['metadata']['name']}")

    def create_dependent(self, obj: dict[str, Any]) -> None:
        """Create an owned object; a same-named one of ours is fine, a leftover of an earlier
        attempt (another owner, being garbage-collected) is waited out."""
        res, kind, name = self.res, kind_of(obj), obj["metadata"]["name"]
        deadline = time.monotonic() + DEPENDENT_RETRY_TIMEOUT
        while True:
            try:
                created = with_retries(lambda: res.create(obj), f"create {obj['kind']} {name}")
                if kind.kind == "Secret":
                    self.record_secret(name, created["metadata"]["uid"])
                return
            except Exception as exc:
                if not is_already_exists(exc):
                    raise
            if kind.kind == "Secret":
                # Ours only if this job's supervisor recorded creating it (one that died
                # mid-way did); else someone else's, holding who knows what code.
                if name in self.secret_uids():
                    return
                raise KubeError(
                    f"Secret {name} already exists and was not created by this job: "
                    "refusing to run the code it holds"
                )
            found = res.get(kind, name)
            if found is not None and owned_by(found, self.uid or ""):
                return
            if time.monotonic() > deadline:
                raise KubeError(f"{obj['kind']} {name} exists and belongs to something else")
            time.sleep(0.2)

    # -- the payload Secrets ----------------------------------------------------------------

    @property
    def secrets_file(self) -> Path:
        return self.ctx.store.job_dir(self.ctx.job.id) / "payload-secrets.json"

    def secret_uids(self) -> dict[str, str]:
        """name -> uid of every payload Secret this job's supervisors created."""
        try:
            uids: dict[str, str] = json.loads(self.secrets_file.read_text())
            return uids
        except (OSError, ValueError):
            return {}

    def record_secret(self, name: str, uid: str) -> None:
        uids = self.secret_uids()
        uids[name] = uid
        write_whole(self.secrets_file, json.dumps(uids).encode())

    def check_secrets(self, dependents: list[dict[str, Any]]) -> None:
        """Before any pod mounts them: each payload Secret is still the one created here
        (same uid; a deleted-and-recreated one is not). Asked as a dry-run delete with a uid
        precondition, so the runner needs no right to read Secrets."""
        uids = self.secret_uids()
        for obj in dependents:
            if obj["kind"] != "Secret":
                continue
            name = obj["metadata"]["name"]
            uid = uids.get(name)
            if uid is None or not with_retries(
                functools.partial(self.holds_secret, name, uid), f"check Secret {name}"
            ):
                raise KubeError(
                    f"Secret {name} is no longer the one this job created: refusing to run "
                    "the code it holds"
                )

    def holds_secret(self, name: str, uid: str) -> bool:
        return self.res.holds(kind_of("v1", "Secret"), name, uid)

    def resume(self, patch: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        res, kind, name, engine = self.res, self.kind, self.name, self.plan.engine
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

    # -- deletion ---------------------------------------------------------------------------

    def wait_gone(self, obj: dict[str, Any]) -> None:
        """An earlier attempt's object: delete it (if nobody is) and wait until it is gone."""
        res, kind, name = self.res, self.kind, self.name
        if not (obj.get("metadata") or {}).get("deletionTimestamp"):
            with_retries(lambda: res.delete(kind, name), f"delete {kind.kind} {name}")
        deadline = time.monotonic() + self.ctx.config.kubernetes_delete_timeout
        while with_retries(lambda: res.get(kind, name), f"get {name}") is not None:
            if time.monotonic() > deadline:
                raise KubeError(f"{kind.kind} {name} of an earlier attempt is still being deleted")
            self.ctx.tick()
            time.sleep(0.1)

    def delete_and_wait(self, seem_gone: Callable[[], bool], wait: Callable[[], None]) -> bool:
        """Delete the job object (foreground: its pods, Secrets, Service, PodGroup go first)
        and wait until it and every pod of the job are gone: whether they are. While it
        waits, `wait()` lets the attempt handle its news for a moment, and `seem_gone()`
        says whether its watches saw everything go (then the API server is asked).

        The delete must happen: it is retried with the one backoff policy until the API
        server accepts it, however long that takes. The job records it as a pending cleanup
        first, so if this supervisor dies meanwhile, the next one or the reaper finishes it."""
        ctx, kind, name = self.ctx, self.kind, self.name
        set_pending_cleanup(ctx.store, ctx.job.id, True)
        told = False

        def delete() -> bool:
            nonlocal told
            try:
                return self.res.delete(kind, name)
            except Exception as exc:
                if kubeconn.retryable(exc) and not told:
                    told = True
                    ctx.logs.system(
                        f"[mlcluster] cannot delete {kind.kind} {name} yet "
                        f"({message_of(exc)}); retrying until it is gone"
                    )
                raise

        try:
            kubeconn.call(
                delete,
                f"delete {kind.kind} {name}",
                give_up_after=None,
                sleep=self.wait_ticking,
                failures=DELETE_FAILURES,
            )
        except Exception as exc:  # noqa: BLE001 - not retryable (e.g. forbidden): say so
            ctx.logs.system(
                f"[mlcluster] could not delete {kind.kind} {name}: {message_of(exc)}; "
                "the reaper tries again"
            )
            return False
        if told:
            ctx.logs.system(f"[mlcluster] {kind.kind} {name} deleted")
        deadline = time.monotonic() + ctx.config.kubernetes_delete_timeout
        next_check = time.monotonic() + VERIFY_GONE_INTERVAL
        while time.monotonic() < deadline:
            if seem_gone() or time.monotonic() > next_check:
                next_check = time.monotonic() + VERIFY_GONE_INTERVAL
                if self.gone():
                    set_pending_cleanup(ctx.store, ctx.job.id, False)
                    return True
            wait()
        # The deletion was accepted: Kubernetes finishes it (the cleanup stays pending for
        # the reaper, which checks that it did).
        ctx.logs.system(
            f"[mlcluster] {kind.kind} {name} or its pods were still being deleted after "
            f"{ctx.config.kubernetes_delete_timeout:g}s; Kubernetes finishes that on its own"
        )
        return False

    def wait_ticking(self, seconds: float) -> None:
        """Sleep between retries, keeping the heartbeat (this supervisor is alive)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.ctx.tick()
            time.sleep(min(left, 0.5))

    def gone(self) -> bool:
        """Ask the API server directly (the watches may be behind or not started); an
        unreachable server means: not known to be gone yet."""
        try:
            if self.res.get(self.kind, self.name) is not None:
                return False
            pods = self.res.list(kind_of("v1", "Pod"), label_selector=job_selector(self.ctx.job.id))
        except KubeError as exc:
            DELETE_FAILURES.failed(f"check that {self.name} is gone", exc)
            return False
        return not pods
