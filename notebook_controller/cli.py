"""Command-line entry points: ``mlcluster controller`` and ``mlcluster manifests``.

The lead's ``mlcluster`` CLI calls ``run_controller(argv)`` and ``print_manifests(argv)``;
``python -m notebook_controller [manifests] ...`` does the same. The controller's application
is here; the manifests' (its many options) is manifests_cli.py.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import sys
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

from traitlets import TraitError, Unicode
from traitlets.config import Application

from jupyterlab_mlcluster.kubeconn import RepeatFilter

from .config import ControllerConfig
from .manifests_cli import ManifestsApp

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Allocations between two young collections (Python's default: 700). A burst keeps many
# young objects alive while they wait for the API, and each young collection walks them
# all: at the default the collector was some 15 % of the controller's CPU at 1,000
# Notebooks, 4.5 % at this threshold (bench_controller, gc.callbacks timed).
GC_YOUNG_THRESHOLD = 20_000


def tune_gc() -> None:
    """Collect young objects less often, and leave what the imports made (most of the heap
    at start, never garbage) out of every later full collection."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


_CONFIG_ALIASES = {
    "namespace": "ControllerConfig.namespaces",
    "kubeconfig": "ControllerConfig.kubeconfig",
    "gateway": "ControllerConfig.gateway",
    "host": "ControllerConfig.host",
    "owner-header": "ControllerConfig.owner_header",
    "cull-idle-time": "ControllerConfig.cull_idle_time",
    "notebook-url-template": "ControllerConfig.notebook_url_template",
    "log-level": "ControllerConfig.log_level",
}


class ControllerApp(Application):
    name = "mlcluster-controller"
    description = (
        "Run the notebook-controller: per-user JupyterLab servers behind Istio, "
        "from Notebook resources (notebooks.mlcluster.io)."
    )
    classes = [ControllerConfig]
    aliases = {
        **_CONFIG_ALIASES,
        "config": "ControllerApp.config_file",
        "liveness": "ControllerApp.liveness_endpoint",
    }
    flags = {
        "no-culling": (
            {"ControllerConfig": {"culling_enabled": False}},
            "Never stop idle notebooks.",
        ),
        "no-istio": ({"ControllerConfig": {"use_istio": False}}, "Create no Istio objects."),
    }
    config_file = Unicode("", config=True, help="A traitlets config file (.py or .json) to load.")
    liveness_endpoint = Unicode(
        "", config=True, help="kopf's liveness endpoint, e.g. http://0.0.0.0:8080/healthz."
    )

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        if self.config_file:
            self.load_config_file(self.config_file)
        self.controller_config = ControllerConfig(parent=self)

    def start(self) -> None:
        import asyncio

        # kubernetes.dynamic (imported with the client, never used here) imports the optional
        # kubernetes_validate where it is installed, and with it jsonschema's format checkers,
        # which build 38 lark grammars: some 20 MiB and seconds of start for nothing.
        if "kubernetes" not in sys.modules:
            sys.modules.setdefault("kubernetes_validate", None)  # type: ignore[arg-type]
        import kopf

        config = self.controller_config
        if config.kubeconfig:
            os.environ["KUBECONFIG"] = config.kubeconfig  # kopf's own login reads it
        level = getattr(logging, config.log_level.upper(), logging.INFO)
        # kopf has three levels: debug (DEBUG), default (INFO), quiet (WARNING).
        kopf.configure(debug=level <= logging.DEBUG, quiet=level >= logging.WARNING)
        # kopf logs each failed attempt of each watch's request: an API outage would cost a
        # line per watched kind per retry. The first of each passes; repeats are counted.
        for handler in logging.getLogger().handlers:
            handler.addFilter(RepeatFilter(prefix="kopf."))
        tune_gc()
        code = asyncio.run(self._run())
        if code:
            raise SystemExit(code)

    async def _operator(self) -> None:
        import kopf

        from .handlers import build_registry, build_settings
        from .kopf_state import NotebookMemories

        config = self.controller_config
        await kopf.operator(
            registry=build_registry(config),
            settings=build_settings(config),
            standalone=True,  # the Lease, not kopf's peering, decides who reconciles
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            liveness_endpoint=self.liveness_endpoint or None,
            memories=NotebookMemories(),
        )

    async def _run(self) -> int:
        """The operator; with leader election, only while this controller holds the Lease."""
        import asyncio

        from .kube import KubeClient
        from .leader import LeaderElection, LeadershipLost

        config = self.controller_config
        if not config.leader_election:
            await self._operator()
            return 0
        kube = await KubeClient.connect(config.kubeconfig, 2)
        election = LeaderElection(
            kube,
            lease_namespace(config),
            config.leader_election_lease,
            config.leader_election_identity or os.environ.get("POD_NAME") or socket.gethostname(),
            lease_duration=config.lease_duration,
            renew_period=config.lease_renew_period,
            retry_period=config.lease_retry_period,
        )
        try:
            async with standby_health(self.liveness_endpoint):
                await election.acquire()
            operator = asyncio.create_task(self._operator())
            holding = asyncio.create_task(election.hold())
            await asyncio.wait({operator, holding}, return_when=asyncio.FIRST_COMPLETED)
            if operator.done():  # stopped (SIGTERM): hand over at once
                holding.cancel()
                await asyncio.gather(holding, return_exceptions=True)
                await election.release()
                operator.result()
                return 0
            operator.cancel()
            await asyncio.gather(operator, return_exceptions=True)
            try:
                holding.result()
            except LeadershipLost as exc:
                # Another controller may lead now: stop reconciling, exit for a restart.
                logging.getLogger("notebook_controller").error("Leadership lost: %s", exc)
            return 1
        finally:
            await kube.close()


def lease_namespace(config: ControllerConfig) -> str:
    if config.leader_election_namespace:
        return config.leader_election_namespace
    try:
        return (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
    except OSError:
        return config.namespaces[0] if config.namespaces else "default"


@contextlib.asynccontextmanager
async def standby_health(endpoint: str) -> AsyncIterator[None]:
    """While waiting for the Lease, answer the liveness probe (kopf's own endpoint only
    exists once it runs): a standby is healthy, not to be restarted."""
    if not endpoint:
        yield
        return
    from aiohttp import web

    url = urllib.parse.urlsplit(endpoint)
    app = web.Application()

    async def standby(_request: web.Request) -> web.Response:
        return web.json_response({"standby": True})

    app.router.add_get(url.path or "/", standby)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, url.hostname, url.port or 80)
    await site.start()
    try:
        yield
    finally:
        await runner.cleanup()


def _unknown_options(app: Application, argv: list[str]) -> list[str]:
    """traitlets only warns about an unknown --option; a typo must not be silently ignored."""
    known = {str(k) for k in app.aliases} | {str(k) for k in app.flags}
    known |= {"help", "help-all", "version", "show-config", "show-config-json", "debug"}
    unknown = []
    for arg in argv:
        if arg.startswith("-"):
            name = arg.lstrip("-").split("=", 1)[0]
            if name not in known and "." not in name:  # --Class.trait=value is always allowed
                unknown.append(arg)
    return unknown


def _run(app: Application, argv: list[str]) -> int:
    unknown = _unknown_options(app, argv)
    if unknown:
        sys.stderr.write(f"{app.name}: unknown option(s): {' '.join(unknown)} (see --help)\n")
        return 2
    try:
        app.initialize(argv)
        app.start()
    except SystemExit as exc:  # traitlets exits on --help and on bad arguments
        return int(exc.code or 0)
    except TraitError as exc:  # a value of the wrong type
        sys.stderr.write(f"{app.name}: {exc}\n")
        return 2
    return 0


def run_controller(argv: list[str]) -> int:
    return _run(ControllerApp(), argv)


def print_manifests(argv: list[str]) -> int:
    return _run(ManifestsApp(), argv)
