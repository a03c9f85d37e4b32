"""Command-line entry points: ``mlcluster controller`` and ``mlcluster manifests``.

The lead's ``mlcluster`` CLI calls ``run_controller(argv)`` and ``print_manifests(argv)``;
``python -m notebook_controller [manifests] ...`` does the same.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import yaml
from traitlets import Bool, List, TraitError, Unicode, validate
from traitlets.config import Application

from .config import ControllerConfig
from .manifests import NOTEBOOK_SERVICE_ACCOUNT, all_manifests
from .objects import namespace_error

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
        import kopf

        from .handlers import build_registry, build_settings

        config = self.controller_config
        if config.kubeconfig:
            os.environ["KUBECONFIG"] = config.kubeconfig  # kopf's own login reads it
        level = getattr(logging, config.log_level.upper(), logging.INFO)
        # kopf has three levels: debug (DEBUG), default (INFO), quiet (WARNING).
        kopf.configure(debug=level <= logging.DEBUG, quiet=level >= logging.WARNING)
        kopf.run(
            registry=build_registry(config),
            settings=build_settings(config),
            standalone=True,
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            liveness_endpoint=self.liveness_endpoint or None,
        )


class ManifestsApp(Application):
    name = "mlcluster-manifests"
    description = "Print what a platform team applies: CRD, RBAC, controller Deployment, Gateway."
    aliases = {
        "namespace": "ManifestsApp.namespace",
        "image": "ManifestsApp.image",
        "gateway": "ManifestsApp.gateway",
        "host": "ManifestsApp.host",
        "owner-header": "ManifestsApp.owner_header",
        "user-namespace": "ManifestsApp.user_namespaces",
        "notebook-service-account": "ManifestsApp.notebook_service_account",
    }
    flags = {
        "no-gateway": (
            {"ManifestsApp": {"include_gateway": False}},
            "Leave out the example Gateway.",
        ),
        "monitoring": (
            {"ManifestsApp": {"monitoring": True}},
            (
                "Also serve the controller's /metrics, and print a Service and ServiceMonitor "
                "(Prometheus Operator) for it and a Grafana dashboard ConfigMap."
            ),
        ),
    }
    namespace = Unicode("mlcluster-system", config=True, help="The controller's namespace.")
    image = Unicode("", config=True, help="Controller image (default: the release image).")
    gateway = Unicode(
        "istio-system/mlcluster-gateway", config=True, help="Istio Gateway of the routes."
    )
    host = Unicode("*", config=True, help="Host the notebook routes answer on.")
    owner_header = Unicode("kubeflow-userid", config=True, help="Header with the user's identity.")
    include_gateway = Bool(True, config=True, help="Include the example Istio Gateway.")
    monitoring = Bool(
        False,
        config=True,
        help="Serve the controller's /metrics and print its ServiceMonitor and a Grafana "
        "dashboard (label grafana_dashboard: '1', for Grafana's dashboard sidecar).",
    )
    user_namespaces = List(
        Unicode(),
        config=True,
        help="Namespaces where users' notebooks run (repeat the option for several): each gets "
        "the service account notebook pods run as, allowed to run `%%distributed --backend "
        "kubernetes` jobs in that namespace and nothing more.",
    )
    notebook_service_account = Unicode(
        NOTEBOOK_SERVICE_ACCOUNT,
        config=True,
        help="The service account notebook pods run as in the user namespaces.",
    )

    @validate("namespace")
    def _valid_namespace(self, proposal: Any) -> str:
        problem = namespace_error(proposal["value"])
        if problem:
            raise TraitError(f"--namespace: {problem}")
        return proposal["value"]

    @validate("user_namespaces")
    def _valid_user_namespaces(self, proposal: Any) -> list[str]:
        for name in proposal["value"]:
            problem = namespace_error(name)
            if problem:
                raise TraitError(f"--user-namespace: {problem}")
        return proposal["value"]

    def start(self) -> None:
        options = {
            "namespace": self.namespace,
            "gateway": self.gateway,
            "host": self.host,
            "owner_header": self.owner_header,
            "include_gateway": self.include_gateway,
            "user_namespaces": self.user_namespaces,
            "notebook_service_account": self.notebook_service_account,
        }
        if self.image:
            options["image"] = self.image
        documents = []
        if self.monitoring:
            from .monitoring import METRICS_PORT, monitoring_manifests

            options["extra_args"] = [f"--ControllerConfig.metrics_port={METRICS_PORT}"]
            documents = monitoring_manifests(self.namespace)
        documents = all_manifests(**options) + documents
        sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False))


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
