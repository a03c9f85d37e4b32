"""The Kubernetes backend: the same job model, run by an existing engine on a cluster.

In the submitting process: `validate` (is there a cluster, an image, an engine that can run
this?) and `prepare` (the `JobPlan`, stored with the job). In the job's supervisor: `run`
(supervise.py). A supervisor that dies is replaced (`supervisor_lost` -> 'respawn'): the
job lives on in the cluster and the new supervisor adopts its objects.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ... import environment
from ...jobs.backend import Backend, SupervisorLost
from ...jobs.model import JobSpec, SpecError
from ...jobs.sessions import is_session_holder
from . import client
from .packages import PackageSync, find_cache_volume, index_settings
from .plan import JobPlan, make_plan
from .trainjob import runtime_missing_message

if TYPE_CHECKING:
    from ...config import MLClusterConfig
    from ...jobs.forensics import StackReport
    from ...jobs.record import JobRecord
    from ...jobs.running.supervisor import JobContext
    from ...jobs.storage.store import JobStore

log = logging.getLogger("jupyterlab_mlcluster.kubernetes")

DISCOVERY_TTL = 30.0  # seconds a discovery answer (served kinds) is trusted
NODES_TTL = 30.0  # seconds the node list (allocatable resources) is reused
# Where the kinds that decide engine and gang are served.
DISCOVERED_GROUPS = (
    "trainer.kubeflow.org/v1alpha1",
    "kubeflow.org/v1",
    "scheduling.volcano.sh/v1beta1",
)


class KubernetesBackend(Backend):
    name = "kubernetes"
    ranks_inherit_environment = False  # pods get the spec's env and the image's

    def __init__(self, config: MLClusterConfig) -> None:
        super().__init__(config)
        self._lock = threading.Lock()
        self._conn: client.Connection | None = None
        self._served: tuple[float, set[str]] | None = None
        self._notebook_pod: tuple[dict[str, Any] | None] | None = None
        self._nodes_seen: tuple[float, list[dict[str, Any]] | None] | None = None
        self._last_plan: tuple[JobSpec, JobPlan] | None = None
        # Where this backend's jobs go: None, the connection's namespace (the configured
        # MLClusterConfig.kubernetes_namespace, else the pod's); see in_namespace.
        self._namespace: str | None = None

    def in_namespace(self, namespace: str) -> KubernetesBackend:
        """A view of this backend whose jobs go to `namespace` (a server that maps each user
        to their own namespace passes the caller's). The namespace is recorded in the job's
        plan, and everything that acts on the job later (its supervisor, cancel, the reaper's
        cleanup, logs) reads it from there. Shares the connection and cluster facts; a view of
        its own, so concurrent submissions for different users never mix their namespaces."""
        view = copy.copy(self)
        view._namespace = namespace
        view._last_plan = None
        return view

    # -- connection and cluster facts (cached; this object lives as long as its JobService) --

    def connection(self, probe: bool = True) -> client.Connection:
        """The cluster connection; `probe`: check that the API server answers (SpecError)."""
        with self._lock:
            if self._conn is None:
                self._conn = client.connect(
                    namespace=self.config.kubernetes_namespace,
                    request_timeout=self.config.kubernetes_request_timeout,
                    probe=False,
                )
        if probe:
            client.check_reachable(self._conn)
        return self._conn

    def served_kinds(self, conn: client.Connection) -> set[str]:
        now = time.monotonic()
        if self._served is None or now - self._served[0] > DISCOVERY_TTL:
            kinds: set[str] = set()
            for group_version in DISCOVERED_GROUPS:
                try:
                    kinds |= client.served_kinds(conn, group_version)
                except Exception as exc:  # noqa: BLE001 - discovery refused: plain Jobs still work
                    log.debug("discovery of %s failed: %s", group_version, exc)
            self._served = (now, kinds)
        return self._served[1]

    def notebook_pod(self, conn: client.Connection) -> dict[str, Any] | None:
        if self._notebook_pod is None:
            self._notebook_pod = (client.own_pod(conn),)
        return self._notebook_pod[0]

    def notebook_image(self, conn: client.Connection) -> str | None:
        pod = self.notebook_pod(conn)
        return client.pod_image(pod) if pod else None

    def package_sync(
        self, conn: client.Connection, spec: JobSpec, image: str
    ) -> PackageSync | None:
        """What the job's pods install first: the packages the notebook's environment gained
        since its pod started, when the job runs the notebook's own image (else the image
        is the user's choice, as built). Filling the wheel cache happens here, in the
        submitting process: it is the notebook's environment."""
        pod = self.notebook_pod(conn)
        if not spec.sync_packages or pod is None or image != client.pod_image(pod):
            return None
        found = environment.changes_since_baseline(self.config.store_dir)
        if not found or not found[0]:
            return None
        requirements, skipped = found
        notes = [
            f"{name} is installed in editable mode in the notebook: its pods run the image's "
            "version, if any"
            for name in skipped
        ]
        index, index_notes = index_settings(environment.pip_config())
        notes += index_notes
        cache = None
        checked: dict[str, list[tuple[str, int, str]]] | None = {}
        if self.config.kubernetes_wheel_cache:
            cache = find_cache_volume(pod, self.config.kubernetes_wheel_cache)
            if cache is None:
                notes.append(
                    f"MLClusterConfig.kubernetes_wheel_cache {self.config.kubernetes_wheel_cache} "
                    "is on no PersistentVolumeClaim of the notebook pod: the pods use the index"
                )
            else:
                notes += environment.fill_wheel_cache(
                    self.config.kubernetes_wheel_cache, requirements
                )
                checked, checked_notes = environment.checked_wheels(
                    self.config.kubernetes_wheel_cache, requirements
                )
                notes += checked_notes
                if checked is None:
                    cache = None  # the pods never see a cache they cannot trust whole
        if cache is None:
            local = environment.local_archives(r.split("==")[0] for r in requirements)
            notes += [
                f"{name} was installed from a file ({path}); without a wheel cache "
                "(MLClusterConfig.kubernetes_wheel_cache) the pods look for it on the index"
                for name, path in sorted(local.items())
            ]
        wheels = list((checked or {}).items()) if cache else []
        return PackageSync(
            requirements=tuple(requirements),
            index=index,
            cache_path=self.config.kubernetes_wheel_cache if cache else None,
            cache_claim=cache[0] if cache else None,
            cache_mount=cache[1] if cache else None,
            cache_sub_path=cache[2] if cache else None,
            cache_hashes=tuple((r, tuple(w[2] for w in ws)) for r, ws in wheels),
            cache_files=tuple((r, tuple((w[0], w[1]) for w in ws)) for r, ws in wheels),
            notes=tuple(notes),
        )

    # -- in the submitting process ----------------------------------------------------------

    def validate(self, spec: JobSpec) -> None:
        if spec.workers > self.config.max_workers:
            raise SpecError(
                f"workers must be at most {self.config.max_workers} (MLClusterConfig.max_workers)"
            )
        self._last_plan = (spec, self._plan(spec))

    def _plan(self, spec: JobSpec) -> JobPlan:
        conn = self.connection()
        c = self.config
        image = None if (spec.image or c.kubernetes_image) else self.notebook_image(conn)
        plan = make_plan(
            spec,
            namespace=self._namespace or conn.namespace,
            served_kinds=self.served_kinds(conn),
            notebook_image=image,
            engine_setting=c.kubernetes_engine,
            gang=c.kubernetes_gang,
            default_image=c.kubernetes_image,
            default_queue=c.kubernetes_queue,
            priority_classes=dict(c.kubernetes_priority_classes),
            service_account=c.kubernetes_service_account,
            gpus_per_node=c.kubernetes_gpus_per_node,
            trainer_runtimes=dict(c.kubernetes_trainer_runtimes),
        )
        if plan.engine == "trainjob":
            self._check_runtime(conn, spec, plan.runtime or "")
        self._check_fits(spec, plan)
        return plan

    def _with_packages(self, spec: JobSpec, plan: JobPlan) -> JobPlan:
        sync = self.package_sync(self.connection(probe=False), spec, plan.image)
        return dataclasses.replace(plan, packages=sync.to_dict()) if sync else plan

    def _check_runtime(self, conn: client.Connection, spec: JobSpec, runtime: str) -> None:
        """A TrainJob naming a runtime the cluster lacks would be refused by the Trainer's
        webhook (or wait forever): refuse it now, naming the runtimes there are. Nothing is
        created. Where runtimes cannot be read (RBAC), the Trainer's answer will tell."""
        kind = client.kind_of("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime")
        try:
            client.with_retries(
                lambda: conn.request("GET", kind.path(name=runtime)), f"read runtime {runtime}"
            )
            return
        except Exception as exc:  # noqa: BLE001 - sorted below: 403, 404, anything else
            if client.status_of(exc) == 403:
                log.debug("cannot read ClusterTrainingRuntime %s: %s", runtime, exc)
                return
            if not client.is_not_found(exc):
                raise SpecError(
                    f"could not check the Kubeflow Trainer runtime {runtime!r}: "
                    f"{client.message_of(exc)}"
                ) from None
        try:
            listing = conn.request("GET", kind.path())
            available = [i["metadata"]["name"] for i in listing.get("items") or []]
        except Exception as exc:  # noqa: BLE001 - the message says what is missing anyway
            log.debug("cannot list ClusterTrainingRuntimes: %s", exc)
            available = []
        raise SpecError(runtime_missing_message(runtime, available, spec.framework))

    def _check_fits(self, spec: JobSpec, plan: JobPlan) -> None:
        """A pod that needs more GPUs than any GPU node has would wait forever: refuse it
        now. Only when the nodes can be read and some have GPUs (an autoscaler may bring GPU
        nodes up from none; the scheduler's reason will tell then)."""
        gpus_per_pod = spec.gpus_per_worker * plan.ranks_per_pod
        gpu_nodes = [n for n in self._nodes() or [] if _gpus(n)] if gpus_per_pod else []
        if not gpu_nodes:
            return
        most = max(_gpus(n) for n in gpu_nodes)
        if gpus_per_pod > most:
            raise SpecError(
                f"each pod needs {gpus_per_pod} GPU(s), but the largest node of this cluster has "
                f"{most} allocatable"
            )

    def prepare(self, spec: JobSpec) -> dict[str, Any]:
        last = self._last_plan
        plan = last[1] if last is not None and last[0] is spec else self._plan(spec)
        return self._with_packages(spec, plan).to_dict()

    # -- schedules: a CronJob + Secret in the namespace; the cluster fires them ------------

    fires_schedules = True

    def register_schedule(self, row: dict[str, Any], payload: bytes) -> None:
        from .schedules import new_secret_name, schedule_cronjob, schedule_secret

        conn = self.connection()
        plan = self._plan(JobSpec.from_dict(row["spec"]))
        account = self.config.kubernetes_schedule_service_account or None
        if account is None:
            pod = client.own_pod(conn)
            account = (pod or {}).get("spec", {}).get("serviceAccountName")
        secret = schedule_secret(
            row, payload, namespace=conn.namespace, name=new_secret_name(row["name"])
        )
        api = client.Resources(conn)
        created: dict[str, Any] | None = None
        try:
            # Create-only: a 409 is someone else's object, never taken as ours.
            created = client.with_retries(
                lambda: api.create(secret), "create the schedule's Secret"
            )
            cronjob = schedule_cronjob(
                row,
                namespace=conn.namespace,
                image=plan.image,
                secret=created,
                service_account=account,
            )
            client.with_retries(lambda: api.create(cronjob), "create the schedule's CronJob")
        except Exception as exc:  # noqa: BLE001 - any failure: undo, then report it
            # Nothing half-made: the Secret we created (that uid only) goes again.
            if created is not None:
                self._delete_schedule_secret(
                    api, created["metadata"]["name"], created["metadata"].get("uid", "")
                )
            raise SpecError(
                f"could not create the schedule in the cluster: {client.message_of(exc)}"
            ) from None

    @staticmethod
    def _delete_schedule_secret(api: client.Resources, name: str, uid: str) -> None:
        """Delete the schedule's Secret only while `name` is still the one we created."""
        kind = client.kind_of("v1", "Secret")
        try:
            if name and uid and api.holds(kind, name, uid):
                api.delete(kind, name, "Background")
        except Exception:
            log.warning("could not remove the schedule's Secret %s", name, exc_info=True)

    def suspend_schedule(self, name: str, suspended: bool) -> None:
        from .schedules import object_name

        api = client.Resources(self.connection())
        kind = client.kind_of("batch/v1", "CronJob")
        client.with_retries(
            lambda: api.patch(kind, object_name(name), {"spec": {"suspend": suspended}}),
            "pause or resume the schedule's CronJob",
        )

    def forget_schedule(self, name: str) -> None:
        from .schedules import ANNOTATION_SECRET, ANNOTATION_SECRET_UID, object_name

        api = client.Resources(self.connection())
        kind = client.kind_of("batch/v1", "CronJob")
        cronjob = client.with_retries(
            lambda: api.get(kind, object_name(name)), "read the schedule's CronJob"
        )
        client.with_retries(
            lambda: api.delete(kind, object_name(name), "Background"),
            "delete the schedule's CronJob",
        )
        annotations = ((cronjob or {}).get("metadata") or {}).get("annotations") or {}
        self._delete_schedule_secret(
            api, annotations.get(ANNOTATION_SECRET, ""), annotations.get(ANNOTATION_SECRET_UID, "")
        )

    def capacity(self) -> dict[str, Any]:
        """Totals of the nodes, in the shape the job store keeps with each job."""
        nodes = self._nodes() or []
        return {
            "cpus": sum(_allocatable(n, "cpu") for n in nodes),
            "gpus": [f"{n['metadata']['name']}/{i}" for n in nodes for i in range(_gpus(n))],
            "memory": int(sum(_allocatable(n, "memory") for n in nodes)),
        }

    def cluster(self) -> dict[str, Any]:
        """GET /cluster's capacity: node allocatable totals, and what is free of them once the
        requests of every scheduled, unfinished pod are taken (free is None where pods
        cannot be listed cluster-wide)."""
        nodes = self._nodes()
        if nodes is None:
            return {
                "gpus": {"total": None, "free": None},
                "cpus": {"total": None, "free": None},
                "memory": {"total": None, "free": None},
            }
        totals = {
            "gpus": sum(_gpus(n) for n in nodes),
            "cpus": sum(_allocatable(n, "cpu") for n in nodes),
            "memory": int(sum(_allocatable(n, "memory") for n in nodes)),
        }
        requested = self._requested({n["metadata"]["name"] for n in nodes})
        return {
            key: {
                "total": total,
                "free": None if requested is None else max(0, total - requested[key]),
            }
            for key, total in totals.items()
        }

    def _nodes(self) -> list[dict[str, Any]] | None:
        """The cluster's nodes (cached a little), or None when they cannot be read (a
        service account that may only see its own namespace)."""
        now = time.monotonic()
        if self._nodes_seen is None or now - self._nodes_seen[0] > NODES_TTL:
            try:
                conn = self.connection(probe=False)
                nodes: list[dict[str, Any]] | None = client.Lister(
                    conn, client.kind_of("v1", "Node")
                )().items
            except Exception as exc:  # noqa: BLE001 - forbidden or unreachable: no node facts
                log.debug("cannot list nodes: %s", exc)
                nodes = None
            self._nodes_seen = (now, nodes)
        return self._nodes_seen[1]

    def _requested(self, node_names: set[str]) -> dict[str, float] | None:
        try:
            conn = self.connection(probe=False)
            pods = client.Lister(conn, client.kind_of("v1", "Pod"))(
                field_selector="status.phase!=Succeeded,status.phase!=Failed"
            )
        except Exception as exc:  # noqa: BLE001
            log.debug("cannot list pods cluster-wide: %s", exc)
            return None
        from kubernetes.utils import parse_quantity

        used = {"gpus": 0.0, "cpus": 0.0, "memory": 0.0}
        for pod in pods.items:
            if (pod.get("spec") or {}).get("nodeName") not in node_names:
                continue
            for container in pod["spec"].get("containers") or []:
                resources = container.get("resources") or {}
                requests = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
                used["cpus"] += float(parse_quantity(requests.get("cpu", "0")))
                used["memory"] += float(parse_quantity(requests.get("memory", "0")))
                used["gpus"] += float(parse_quantity(requests.get("nvidia.com/gpu", "0")))
        return used

    # -- in the job's supervisor ------------------------------------------------------------

    def fleet_key(self, origin: dict[str, Any]) -> str | None:
        """Jobs are supervised together, per cluster and policy: what the environment says
        of both (the kubeconfig, the in-cluster address, our own variables) names the fleet,
        so a job submitted with another environment gets a fleet of its own. A session's
        supervisor holds its cells and channels: a process of its own."""
        if origin.get("session") or origin.get("session_job"):
            return None
        import hashlib

        said = sorted(
            (k, v)
            for k, v in os.environ.items()
            if k in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "HOME")
            or k.startswith("MLCLUSTER_")
        )
        return "kubernetes-" + hashlib.sha256(repr(said).encode()).hexdigest()[:16]

    def run(self, ctx: JobContext) -> None:
        from .supervise import JobRun

        plan = JobPlan.from_dict(ctx.job.backend_state)
        if ctx.member is not None:  # a fleet's job: its connection and watches are shared
            from .shared_watches import SHARED

            conn = SHARED.connection(plan.namespace, self.config.kubernetes_request_timeout)
            JobRun(ctx, plan, conn, SHARED).run()
            return
        conn = client.connect(
            namespace=plan.namespace,
            request_timeout=self.config.kubernetes_request_timeout,
            # a log stream per pod and two watches hold a connection each
            pool_size=ctx.job.spec.workers + 8,
            probe=False,
        )
        log.debug("connected to %s", conn.host)
        try:
            if is_session_holder(ctx.job):
                from .session import SessionRun

                SessionRun(ctx, plan, conn).run()
                return
            JobRun(ctx, plan, conn).run()
        finally:
            conn.api.close()

    def supervisor_lost(self, store: JobStore, job: JobRecord) -> SupervisorLost:
        # A session's cells and channels live in its supervisor: without it the session
        # ends (the reaper deletes its objects: cleanup_orphans). A job lives on.
        return SupervisorLost.FAIL if is_session_holder(job) else SupervisorLost.RESPAWN

    # Its supervisor feeds the stall watch from the pods' logs (forensics.py).
    watches_stalls = True

    def collect_stacks(
        self, store: JobStore, job: JobRecord, ranks: list[int] | None, native: bool
    ) -> StackReport:
        """Each rank's own helper, asked over its pod's network (stacks.py): a pod has no
        SYS_PTRACE, so nothing reads a rank from outside."""
        from .stacks import collect

        return collect(store, job, ranks, native)

    def cleanup_orphans(self, store: JobStore, job: JobRecord) -> None:
        """The supervisor died (the job is cancelled), or a final job still has a pending
        cleanup: delete its job object (foreground; its pods and owned objects go with
        it). One bounded attempt; until the objects are gone the cleanup stays pending and
        the reaper comes back (cleanup.py)."""
        from .cleanup import set_pending_cleanup, try_cleanup

        set_pending_cleanup(store, job.id, True)
        try_cleanup(store, store.get_job(job.id), self.config.kubernetes_request_timeout)


def _allocatable(node: dict[str, Any], resource: str) -> float:
    from kubernetes.utils import parse_quantity

    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    return float(parse_quantity(value)) if value is not None else 0.0


def _gpus(node: dict[str, Any]) -> int:
    return int(_allocatable(node, "nvidia.com/gpu"))
