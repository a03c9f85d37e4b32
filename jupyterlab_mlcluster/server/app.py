"""The Jupyter server extension: one JobService for the magic, the sidebar and REST.

Enabled by `jupyter-config/jupyter_server_config.d/jupyterlab_mlcluster.json`. Its own
settings are traitlets of `MLClusterApp` (config file `jupyter_mlcluster_config`); the
engine's settings are `MLClusterConfig`'s, read from the same config, so
`c.MLClusterConfig.cpu_slots = 16` works in jupyter_server_config too.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Int, List, TraitError, Unicode, validate

from .. import backends  # noqa: F401 - a front end fills the backend registry
from ..config import MLClusterConfig
from ..jobs.service import JobService
from ..jobs.storage.snapshot import JobSnapshot
from ..kubeconn import KubeConnection
from .caller_slots import CallerSlots
from .confinement import confine
from .events import EventBroadcaster, EventsHandler
from .handlers import cluster, experiments, job_export, job_outputs, jobs, notebooks, sessions
from .handlers.base import MLClusterHandler
from .identity import calling_user
from .metrics import ServerMetrics
from .notebook_feed import NotebookFeed
from .notebook_watch import NotebookWatch
from .notebooks import NotebookService, UserNamespaces
from .openapi import API_PREFIX, Validators, build_document
from .scheduling import ServerScheduler
from .tensorboard import TensorBoardPlaces, TensorBoards
from .tensorboard_proxy import proxy_routes
from .user_namespace import DEFAULT_TEMPLATE, BadTemplate, NamespaceTaken, check_template

T = TypeVar("T")
# A shared server's per-user quotas on the job store unless the operator sets them.
SHARED_JOB_QUOTA = 200
SHARED_STORE_QUOTA_MIB = 1024


def route_pattern(api_path: str) -> str:
    """'/jobs/{id}/logs' -> '/mlcluster/api/jobs/([^/]+)/logs' (tornado passes groups in order)."""
    parts = [("([^/]+)" if p.startswith("{") else p) for p in api_path.split("/")]
    return API_PREFIX + "/".join(parts)


# Every route the extension serves, by resource (each handler names its OpenAPI path).
ROUTE_HANDLERS: list[type[MLClusterHandler]] = [
    # jobs
    jobs.JobsHandler,  # /jobs
    jobs.JobHandler,  # /jobs/{id}
    job_outputs.LogsHandler,  # /jobs/{id}/logs
    job_outputs.MetricsHandler,  # /jobs/{id}/metrics
    job_outputs.StacksHandler,  # /jobs/{id}/stacks
    job_outputs.TensorBoardHandler,  # /jobs/{id}/tensorboard
    job_outputs.ResultHandler,  # /jobs/{id}/result
    job_export.JobExportHandler,  # /jobs/{id}/export
    # sweeps and schedules
    experiments.SweepsHandler,  # /sweeps
    experiments.SweepHandler,  # /sweeps/{id}
    experiments.SchedulesHandler,  # /schedules
    experiments.ScheduleHandler,  # /schedules/{name}
    experiments.SchedulePauseHandler,  # /schedules/{name}/pause
    experiments.ScheduleResumeHandler,  # /schedules/{name}/resume
    experiments.ScheduleRunsHandler,  # /schedules/{name}/runs
    # sessions
    sessions.SessionsHandler,  # /sessions
    sessions.SessionHandler,  # /sessions/{name}
    sessions.SessionRestartHandler,  # /sessions/{name}/restart
    # notebook servers (Kubernetes)
    notebooks.NotebooksHandler,  # /notebooks
    notebooks.NotebookHandler,  # /notebooks/{name}
    notebooks.NotebookStopHandler,  # /notebooks/{name}/stop
    notebooks.NotebookStartHandler,  # /notebooks/{name}/start
    # the server itself
    cluster.ClusterHandler,  # /cluster
    cluster.OpenAPIHandler,  # /openapi.json
]


def routes() -> list[tuple[str, type]]:
    """(OpenAPI path, handler) of every route the extension serves."""
    return [(h.api_path, h) for h in ROUTE_HANDLERS] + [("/events", EventsHandler)]


def _belongs(namespace_of: UserNamespaces, owner: str, namespace: str) -> bool:
    """Is `namespace` the one `owner`'s notebooks live in (none where it is taken)?"""
    try:
        return namespace_of(owner) == namespace
    except NamespaceTaken:
        return False


class MLClusterApp(ExtensionApp):
    name = "mlcluster"
    load_other_extensions = True
    classes = [*ExtensionApp.classes, MLClusterConfig]  # traitlets' own pattern

    executor_threads = Int(
        8,
        help="Threads that run the extension's blocking work (job store, log files, process "
        "checks, Kubernetes calls) off the event loop. A cancel waits in one for up to the "
        "kill grace period.",
    ).tag(config=True)

    executor_threads_per_caller = Int(
        4,
        help="On a server shared through the identity header: the most executor threads one "
        "caller's requests hold at once (their further requests wait, holding none), so no "
        "user's slow or repeated requests make the others wait. At least 1.",
    ).tag(config=True)

    @validate("executor_threads_per_caller")
    def _valid_threads_per_caller(self, proposal: Any) -> int:
        if proposal["value"] < 1:
            raise TraitError("MLClusterApp.executor_threads_per_caller must be at least 1")
        return proposal["value"]

    cancel_jobs_on_shutdown = Bool(
        False,
        help="Cancel unfinished jobs that were submitted through this server (its REST API or "
        "its kernels) when the server stops. By default they keep running, and a restarted "
        "server finds them (finished or still running) in the store.",
    ).tag(config=True)

    event_poll_interval = Float(
        0.05,
        help="Seconds between looks at the job store's change feed for the /events websocket "
        "and followed logs (each look is one cheap SQLite PRAGMA when nothing changed).",
    ).tag(config=True)

    event_max_rate = Float(
        10.0,
        help="Most /events messages per second about one job; faster changes are coalesced "
        "into the newest state.",
    ).tag(config=True)

    snapshot_limit = Int(
        200,
        help="Newest jobs in the snapshot a /events client gets on connect (unfinished jobs "
        "are always included; older ones are available from GET /jobs).",
    ).tag(config=True)

    switch_interval = Float(
        0.001,
        help="Python's thread switch interval (sys.setswitchinterval) for the server process, "
        "in seconds; 0 leaves Python's default (0.005). The event loop shares the GIL with the "
        "executor threads that read the job store and logs; each time the loop returns from "
        "I/O it may wait this long for the GIL, so a shorter interval keeps it responsive "
        "while jobs print heavily.",
    ).tag(config=True)

    schedule_interval = Float(
        10.0,
        help="Seconds between this server's passes over the schedules (mlcluster schedule): "
        "due ticks are fired as jobs. Any number of servers and `mlcluster scheduler` daemons "
        "may fire the same store's schedules; each tick runs once. 0: this server fires none.",
    ).tag(config=True)

    freeze_gc_on_start = Bool(
        True,
        help="Call gc.freeze() once the server has started: the objects of a started server "
        "(modules, classes, settings) live as long as it does, and a full garbage collection "
        "walking all of them stalls the event loop for a long time on a big heap (hundreds of "
        "ms on a slow machine). Frozen objects are not scanned; new ones are collected as usual.",
    ).tag(config=True)

    warm_pool_prestart = Bool(
        True,
        help="Start the local warm pool (MLClusterConfig.warm_pool) in the background when the "
        "server starts, so the first %%distributed cell of the session starts warm too.",
    ).tag(config=True)

    notebook_namespace = Unicode(
        "",
        help="One namespace for every user's Notebook objects (a single-namespace install: "
        "users are then told apart only by spec.owner). '' (the default): with "
        "trust_identity_header, each user's notebooks live in the user's own namespace "
        "(user_namespace_template); without it (one user per server), in "
        "MLClusterConfig.kubernetes_namespace, else this pod's namespace, else 'default'.",
    ).tag(config=True)

    user_namespace_template = Unicode(
        DEFAULT_TEMPLATE,
        help="Where a user's notebooks live when each user has their own namespace (see "
        "notebook_namespace): the namespace of a Kubeflow Profile the user owns "
        "(kubeflow.org/v1, spec.owner {kind: User, name: <user>}) where the Profile CRD is "
        "served, else this template with {user} replaced, made a DNS-1123 label (lowercase, "
        "other characters '-', at most 63; a hash of the name is appended whenever that "
        "changes it, so two users never share one). Keep a prefix: '{user}' alone would let a "
        "user named 'kube-system' spawn there. The namespace must exist (`mlcluster manifests "
        "--user-namespace NS`).",
    ).tag(config=True)

    notebook_image = Unicode(
        "",
        help="Image of spawned notebook servers when a request names none ('' = "
        "MLClusterConfig.kubernetes_image; if that is empty too, the notebook-controller's "
        "ControllerConfig.default_image).",
    ).tag(config=True)

    notebook_quota = Int(
        3,
        help="Most notebook servers one user may have (stopped ones count: they keep their "
        "workspace volume; ones being deleted do not); 0 means no limit. Spawning one more is "
        "refused with 403 and a message saying so.",
    ).tag(config=True)

    trust_identity_header = Bool(
        False,
        help="Take the caller's identity (the owner of the notebook servers it sees and spawns) "
        "from `identity_header` instead of the Jupyter Server identity provider. Only for a "
        "server that sits behind an authenticating proxy which sets that header on every "
        "request (and drops any the client sent): anyone who reaches the server some other way "
        "could claim any identity. A request without the header is refused (403). Such a "
        "server is shared by many users and runs as one Unix user, so it then serves only "
        "JupyterLab's page (and the reads it makes) and the mlcluster API: kernels, "
        "terminals, contents, sessions and every write of Jupyter's own answer 403 "
        "(server/confinement.py lists what is served).",
    ).tag(config=True)

    allow_local_jobs_when_shared = Bool(
        False,
        help="Run local-backend and Slurm jobs (every backend whose ranks run as this server's "
        "account: Backend.ranks_inherit_environment) submitted through the REST API on a "
        "server shared by many users (per_user_namespaces: trust_identity_header and no "
        "notebook_namespace). Every such job runs as this server's one Unix user (on its "
        "machine, or in a Slurm allocation of its account), so one user's job code "
        "can read another's job files, environment (tokens, keys) and processes, and the "
        "server's own. Off (the default), as JupyterHub never runs two users' code as one Unix "
        "user: such a job is refused (403, nothing stored or started), a request naming no "
        "backend gets kubernetes (the user's own namespace) whatever "
        "MLClusterConfig.default_backend says, the warm pool is not prestarted and this server "
        "fires no local schedules. Turn on only for a single-tenant deployment that still "
        "trusts the header. Jobs from kernels and the CLI in a user's own notebook pod run in "
        "that pod and are not affected either way.",
    ).tag(config=True)

    identity_header = Unicode(
        "kubeflow-userid",
        help="Request header carrying the authenticated user's identity when "
        "trust_identity_header is on (Kubeflow's default; the notebook-controller's "
        "ControllerConfig.owner_header must name the same header).",
    ).tag(config=True)

    identity_header_prefix = Unicode(
        "",
        help="Prefix the proxy puts before the identity in identity_header (Kubeflow's "
        "userid-prefix, e.g. 'accounts.google.com:'); removed to give the owner, as the "
        "notebook-controller's ControllerConfig.owner_header_prefix adds it back.",
    ).tag(config=True)

    watched_namespaces = List(
        Unicode(),
        help="With per-user namespaces: the user namespaces whose Notebooks and events this "
        "server follows (for /events), each on its own, so that its RBAC grants those reads "
        "there only (`mlcluster manifests --user-namespace` sets it and prints that RBAC). "
        "Empty: one watch of every namespace, which needs cluster-wide reads (user namespaces "
        "not known in advance, e.g. Kubeflow Profiles).",
    ).tag(config=True)

    jwt_issuer = Unicode(
        "",
        help="With trust_identity_header: the OIDC issuer whose JWT (Authorization: Bearer, "
        "which the gateway forwards) must name the caller; the identity header alone is then "
        "never enough (server/jwt_identity.py). Empty: the header is believed as it is.",
    ).tag(config=True)
    jwt_jwks_uri = Unicode(
        "",
        help="URL of jwt_issuer's signing keys; empty: found from the issuer's "
        "/.well-known/openid-configuration.",
    ).tag(config=True)
    jwt_audiences = List(
        Unicode(),
        help="Accepted 'aud' values of the JWTs; required with jwt_issuer (the server refuses "
        "to start without them: a token minted for another application must not log in).",
    ).tag(config=True)
    jwt_payload_header = Unicode(
        "",
        help="With jwt_issuer: the header in which the gateway passes on the payload of the JWT "
        "it verified (Istio's outputPayloadToHeader), for requests that carry no bearer token "
        "(the printed gateway drops the raw token, so that no other route on it receives it). "
        "Its claims are checked (issuer, audience, expiry, user claim, email_verified), not a "
        "signature (it has none): believe it only where nothing but the gateway reaches this "
        "server. Empty: a bearer token is required.",
    ).tag(config=True)
    jwt_user_claim = Unicode(
        "email",
        help="The JWT claim naming the user (the gateway copies the same one). With 'email' the "
        "token must also carry email_verified: true.",
    ).tag(config=True)

    tensorboard_user_dir = Unicode(
        "",
        help="On a server shared through trust_identity_header: the directory under which a "
        "caller's jobs may name TensorBoard directories (`tensorboard` in POST /jobs, or "
        "MLCLUSTER_TENSORBOARD_DIR in their env), `{user}` being the caller's identity, e.g. "
        "'/mnt/tensorboard/{user}' on a volume the ranks share. Checked by realpath (no symlink "
        "or '..' leads out, nor any symlink inside the directory: its tree is walked, bounded), "
        "at submit (400, nothing stored) and again whenever TensorBoard is opened (403). "
        "'': only the job's own directory in the store, the operator's "
        "MLClusterConfig.tensorboard_dir and tensorboard_allowed_uris. A server not shared "
        "reads whatever its user names.",
    ).tag(config=True)

    tensorboard_allowed_uris = List(
        Unicode(),
        default_value=[],
        help="On a server shared through trust_identity_header: URI prefixes a caller's job "
        "may name as its TensorBoard directory (TensorBoard reads them with this server's "
        "credentials, for everyone), `{user}` being the caller's identity, e.g. "
        "['s3://team-runs/{user}/']. Empty (the default): no URI but the operator's "
        "MLClusterConfig.tensorboard_dir.",
    ).tag(config=True)

    tensorboard_idle_timeout = Float(
        1800.0,
        help="Seconds a TensorBoard started for jobs (POST /jobs/{id}/tensorboard) may go "
        "without a request through its proxy before it is stopped; 0 keeps it until the "
        "server stops. Opening it again starts a new one.",
    ).tag(config=True)

    tensorboard_start_timeout = Float(
        120.0,
        help="Seconds to wait for a TensorBoard process to listen before answering 503.",
    ).tag(config=True)

    tensorboard_reload_interval = Float(
        5.0,
        help="TensorBoard's --reload_interval: seconds between its reads of new event data.",
    ).tag(config=True)

    tensorboard_max_per_user = Int(
        3,
        min=0,
        help="Most TensorBoard processes one user may have running (one per distinct set of "
        "jobs opened, each ~90 MiB); opening one more stops that user's least recently used. "
        "On a server not shared, its one user's. 0: no cap.",
    ).tag(config=True)

    tensorboard_max_total = Int(
        20,
        min=0,
        help="Most TensorBoard processes this server runs for all its users together; at the "
        "cap, opening another is refused (503, saying so) until one stops after "
        "tensorboard_idle_timeout: no user's TensorBoard is stopped for another's. "
        "0: no cap.",
    ).tag(config=True)

    owner_job_quota = Int(
        -1,
        help="On a server shared through trust_identity_header: most jobs one user may keep in "
        "the job store (every state; purged ones do not count). Submitting one more is refused "
        "(403, nothing stored) saying so and how to purge. -1: 200 on a shared server, no "
        "limit otherwise; 0: no limit.",
    ).tag(config=True)

    owner_store_quota_mib = Int(
        -1,
        help="On a server shared through trust_identity_header: most MiB one user's kept jobs "
        "may hold in the job store (their directories: logs, results, payloads, default "
        "TensorBoard data). Checked when a job is submitted: at or over it, the submission is "
        "refused (403, nothing stored). A job already accepted still runs to its own caps "
        "(MLClusterConfig.max_log_mib, max_result_mib). -1: 1024 on a shared server, no limit "
        "otherwise; 0: no limit.",
    ).tag(config=True)

    max_request_body = Int(
        8 << 20,
        help="Largest request body (bytes) the mlcluster API reads: a larger Content-Length is "
        "answered 413 before any of the body is read, a chunked body is cut off there. The "
        "default holds the largest job the API document allows (its `code` is at most 4 MiB) "
        "and keeps one request from costing the server Jupyter's own limit "
        "(ServerApp.max_body_size, 512 MiB) several times over.",
    ).tag(config=True)

    metrics_interval = Float(
        5.0,
        help="Seconds between reads of the job store for the mlcluster_* series on Jupyter "
        "Server's /metrics (a scrape serves the newest read and never touches the store). "
        "0: the extension exports no metrics.",
    ).tag(config=True)

    @property
    def per_user_namespaces(self) -> bool:
        """Each user's notebooks in their own namespace: identity from the trusted header
        (many users on this server) and no single namespace forced (notebook_namespace)."""
        return self.trust_identity_header and not self.notebook_namespace

    @property
    def refuses_local_jobs(self) -> bool:
        """Local jobs would run as this server's one Unix user for many users: refused (see
        allow_local_jobs_when_shared)."""
        return self.per_user_namespaces and not self.allow_local_jobs_when_shared

    @property
    def job_quota(self) -> int:
        """Most jobs one user may keep (owner_job_quota resolved; 0: no limit)."""
        if self.owner_job_quota >= 0:
            return self.owner_job_quota
        return SHARED_JOB_QUOTA if self.trust_identity_header else 0

    @property
    def store_quota_bytes(self) -> int:
        """Most bytes one user's kept jobs may hold (owner_store_quota_mib resolved; 0: none)."""
        mib = self.owner_store_quota_mib
        if mib < 0:
            mib = SHARED_STORE_QUOTA_MIB if self.trust_identity_header else 0
        return mib * 1024 * 1024

    @validate("user_namespace_template")
    def _valid_template(self, proposal: Any) -> str:
        try:
            return check_template(proposal["value"])
        except BadTemplate as exc:
            raise TraitError(str(exc)) from None

    # -- setup ------------------------------------------------------------------------------

    def initialize_settings(self) -> None:
        if self.switch_interval > 0:
            sys.setswitchinterval(self.switch_interval)
        self.jwt_verifier: Any = None
        if self.jwt_issuer:
            if not self.trust_identity_header:
                raise TraitError("MLClusterApp.jwt_issuer needs trust_identity_header")
            if not [a for a in self.jwt_audiences if a]:
                # Fatal, not a TraitError: Jupyter Server logs an extension's failure and
                # serves on without it, which, with its own token off (as the printed
                # Deployment runs it), would be a server open to anyone.
                self.log.critical(
                    "mlcluster: MLClusterApp.jwt_issuer needs MLClusterApp.jwt_audiences (the "
                    "'aud' of this application's tokens): without them a token its issuer "
                    "minted for any other application would log in here. Not starting."
                )
                raise SystemExit(2)
            from .jwt_identity import JwtVerifier

            self.jwt_verifier = JwtVerifier(
                self.jwt_issuer,
                jwks_uri=self.jwt_jwks_uri,
                audiences=self.jwt_audiences,
                user_claim=self.jwt_user_claim,
                payload_header=self.jwt_payload_header,
            )
            self.jwt_verifier.start()  # reads the keys in its own thread
        self.mlconfig = MLClusterConfig(parent=self)
        if self.refuses_local_jobs:
            # A job naming no backend must not be refused for a default the user did not
            # pick: it goes to the user's own namespace. /cluster and metrics follow suit.
            self.log.info(
                "mlcluster: this server is shared by many users (per-user namespaces): "
                "local jobs are refused and no local schedule is fired; default backend "
                "kubernetes (MLClusterApp.allow_local_jobs_when_shared)"
            )
            self.mlconfig.default_backend = "kubernetes"
        self.service = JobService(config=self.mlconfig)
        self.executor = ThreadPoolExecutor(self.executor_threads, thread_name_prefix="mlcluster")
        self.caller_slots = CallerSlots(self.executor_threads_per_caller)
        self.document = build_document(max_workers=self.mlconfig.max_workers)
        self.validators = Validators(self.document)
        self.broadcaster = EventBroadcaster(
            self.service,
            poll_interval=self.event_poll_interval,
            max_rate=self.event_max_rate,
            snapshot_limit=self.snapshot_limit,
        )
        namespace = self.notebook_namespace or self.mlconfig.kubernetes_namespace
        # Connections of their own: the watch's looking for a cluster in the background must
        # not decide what a REST call finds (each looks again when it needs to).
        namespace_of = None
        if self.per_user_namespaces:
            namespace_of = UserNamespaces(KubeConnection(), self.user_namespace_template)
        # user -> namespace where each user has their own (their notebooks and their
        # Kubernetes jobs go there); None: one namespace for all.
        self.namespace_of: UserNamespaces | None = namespace_of
        self.notebook_feed = NotebookFeed(
            self.broadcaster.publish_to_user,
            belongs=functools.partial(_belongs, namespace_of) if namespace_of else None,
        )
        self.notebook_watch = NotebookWatch(
            KubeConnection(namespace),
            self.notebook_feed,
            all_namespaces=self.per_user_namespaces,
            namespaces=self.watched_namespaces if self.per_user_namespaces else (),
        )
        self.notebooks = NotebookService(
            KubeConnection(namespace),
            image=self.notebook_image or self.mlconfig.kubernetes_image,
            quota=self.notebook_quota,
            progress=self.notebook_feed.progress,
            namespace_of=namespace_of,
        )
        # Where callers' jobs may have TensorBoard read; None: anywhere (one user's server).
        self.tensorboard_places: TensorBoardPlaces | None = None
        if self.trust_identity_header:
            self.tensorboard_places = TensorBoardPlaces(
                self.tensorboard_user_dir, tuple(self.tensorboard_allowed_uris)
            )
        # Identifies jobs submitted through this server process (cancel_jobs_on_shutdown).
        self.server_id = f"{os.uname().nodename}:{os.getpid()}:{time.time():.3f}"
        self._stopped = False
        assert self.serverapp is not None  # an extension runs inside its server
        self.job_cwd = os.path.abspath(os.path.expanduser(self.serverapp.root_dir))
        self.log.info(
            "mlcluster: job store %s, backend %s",
            self.service.store.root,
            self.mlconfig.default_backend,
        )

    def initialize_handlers(self) -> None:
        assert self.serverapp is not None  # an extension runs inside its server
        if self.trust_identity_header:
            # Many users, one Unix user: Jupyter's kernels, terminals and files are closed
            # (a kernel here is code execution as the server); the lab page and our API stay.
            confine(self.serverapp.web_app, self.serverapp.base_url)
            self.serverapp.authorizer = self.serverapp.web_app.settings["authorizer"]
        self.handlers.extend((route_pattern(path), handler) for path, handler in routes())
        self.handlers.extend(proxy_routes())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        # Settle jobs whose supervisors died while no server was watching.
        reaped = await self.run(self.service.reap, True)
        if reaped:
            self.log.info(
                "mlcluster: settled %d job(s) whose supervisor had died: %s", len(reaped), reaped
            )
        self.broadcaster.ensure_started()
        self.notebook_watch.start()  # publishes through the broadcaster, so after it
        # The server fires only local schedules (Kubernetes ones are CronJobs): none where
        # local jobs would run as the one Unix user of a shared server.
        interval = 0 if self.refuses_local_jobs else self.schedule_interval
        self.scheduler = ServerScheduler(self, interval)
        self.scheduler.start()
        assert self.serverapp is not None  # an extension runs inside its server
        self.tensorboards = TensorBoards(
            self.serverapp.base_url,
            idle_timeout=self.tensorboard_idle_timeout,
            start_timeout=self.tensorboard_start_timeout,
            reload_interval=self.tensorboard_reload_interval,
            per_user=self.tensorboard_max_per_user,
            total=self.tensorboard_max_total,
        )
        self.job_snapshot = JobSnapshot(self.service.store)
        self.metrics = ServerMetrics(
            self._metrics_source,
            self.run,
            self.metrics_interval,
            shared=self.trust_identity_header,  # many users read it: nobody's job labels
        )
        self.metrics.start()
        if self.warm_pool_prestart and self.mlconfig.warm_pool and not self.refuses_local_jobs:
            from ..jobs import warm

            # Fire and forget: it takes seconds (import torch) in its own process.
            self.executor.submit(warm.ensure_zygote, self.mlconfig, False)
        from .. import environment

        # What this pod's image holds, once per pod: jobs' pods install what is added later.
        self.executor.submit(environment.record_baseline, self.mlconfig.store_dir)
        if self.freeze_gc_on_start:
            gc.freeze()

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking work in the extension's executor."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def user_identity(self, current_user: Any, headers: Mapping[str, str]) -> str:
        """Who a request comes from, for notebook servers; IdentityError if it cannot say."""
        return calling_user(
            current_user,
            headers,
            trust_header=self.trust_identity_header,
            header=self.identity_header,
            prefix=self.identity_header_prefix,
            verifier=self.jwt_verifier,
        )

    # -- shutdown ---------------------------------------------------------------------------

    async def stop_extension(self) -> None:
        if getattr(self, "_stopped", True):
            return  # never started, or already stopped
        self._stopped = True
        if self.cancel_jobs_on_shutdown:
            assert self.serverapp is not None  # an extension runs inside its server
            kernel_ids = set(self.serverapp.kernel_manager.list_kernel_ids())
            try:
                cancelled = await self.run(self._cancel_own_jobs, kernel_ids)
                if cancelled:
                    self.log.info(
                        "mlcluster: cancelled %d job(s) on shutdown: %s", len(cancelled), cancelled
                    )
            except Exception:
                self.log.exception("mlcluster: cancelling jobs on shutdown failed")
        await asyncio.to_thread(self.notebook_watch.stop)
        if getattr(self, "jwt_verifier", None) is not None:
            await asyncio.to_thread(self.jwt_verifier.stop)
        if getattr(self, "scheduler", None) is not None:
            await self.scheduler.stop()
        if getattr(self, "metrics", None) is not None:
            await self.metrics.stop()
        if getattr(self, "tensorboards", None) is not None:
            await self.tensorboards.stop()
        await self.broadcaster.stop()
        await asyncio.to_thread(self.executor.shutdown, True, cancel_futures=True)

    def _metrics_source(self) -> tuple[list[Any], dict[str, Any] | None]:
        """The store's jobs and the cluster summary (blocking; the metrics' executor read)."""
        self.service.reap()
        jobs = self.job_snapshot.records()  # what changed since the last read, not every job
        try:
            cluster = self.service.cluster()
        except Exception:  # noqa: BLE001 - a cluster out of reach: no capacity figures
            cluster = None
        return jobs, cluster

    def _cancel_own_jobs(self, kernel_ids: set[str]) -> list[str]:
        mine = []
        active, _ = self.service.list(states=["queued", "starting", "running"])
        for job in active:
            origin = job.origin or {}
            if origin.get("server") == self.server_id or origin.get("kernel_id") in kernel_ids:
                mine.append(job.id)
        for job_id in mine:
            self.service.store.request_cancel(job_id)
        for job_id in mine:
            self.service.cancel(job_id, wait=True)
        return mine
