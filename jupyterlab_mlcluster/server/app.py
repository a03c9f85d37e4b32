"""The Jupyter server extension: one JobService for the magic, the sidebar and REST.

Enabled by `jupyter-config/jupyter_server_config.d/jupyterlab_mlcluster.json`. Its own
settings are traitlets of `MLClusterApp` (config file `jupyter_mlcluster_config`); the
engine's settings are `MLClusterConfig`'s, read from the same config, so
`c.MLClusterConfig.cpu_slots = 16` works in jupyter_server_config too. Those of a server
shared by many users are shared_settings.py's; the routes it serves, routes.py.
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
from traitlets import Bool, Float, Int, TraitError, Unicode, validate

from .. import backends  # noqa: F401 - a front end fills the backend registry
from ..config import MLClusterConfig
from ..jobs.service import JobService
from ..jobs.storage.snapshot import JobSnapshot
from ..kubeconn import KubeConnection
from .caller_slots import CallerSlots
from .confinement import confine
from .events import EventBroadcaster
from .identity import calling_user
from .metrics import ServerMetrics
from .notebook_feed import NotebookFeed
from .notebook_watch import NotebookWatch
from .notebooks import NotebookService, UserNamespaces
from .openapi import Validators, build_document
from .routes import route_pattern, routes
from .scheduling import ServerScheduler
from .shared_settings import SharedServerSettings
from .tensorboard import TensorBoardPlaces, TensorBoards
from .tensorboard_proxy import proxy_routes
from .user_namespace import NamespaceTaken

T = TypeVar("T")


def _belongs(namespace_of: UserNamespaces, owner: str, namespace: str) -> bool:
    """Is `namespace` the one `owner`'s notebooks live in (none where it is taken)?"""
    try:
        return namespace_of(owner) == namespace
    except NamespaceTaken:
        return False


class MLClusterApp(ExtensionApp, SharedServerSettings):
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
