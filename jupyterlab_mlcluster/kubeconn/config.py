"""Where the cluster is, the way kubectl finds it: a kubeconfig given explicitly (an argument,
or `$KUBECONFIG`, a list of files joined by `os.pathsep` and merged), else the pod's service
account when running inside a cluster, else `~/.kube/config`; and which namespace. Read at
every call: the `kubernetes` package reads `$KUBECONFIG` only once, when first imported."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import NO_CLUSTER, ClusterUnavailable

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = "~/.kube/config"


def in_cluster(service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> bool:
    """Whether this process runs in a pod with a service account token."""
    return (
        bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        and (service_account_dir / "token").is_file()
    )


def kubeconfig_files(kubeconfig: str = "") -> list[str]:
    """The kubeconfig files that exist among those named (an argument, else $KUBECONFIG,
    else ~/.kube/config; a list joined by os.pathsep)."""
    named = kubeconfig or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    paths = [Path(p).expanduser() for p in named.split(os.pathsep) if p]
    return [str(p) for p in paths if p.is_file()]


def _uses_kubeconfig(kubeconfig: str, service_account_dir: Path) -> bool:
    return bool(kubeconfig or os.environ.get("KUBECONFIG")) or not in_cluster(service_account_dir)


def _no_kubeconfig(kubeconfig: str) -> ClusterUnavailable:
    where = kubeconfig or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    return ClusterUnavailable(
        f"{NO_CLUSTER}: not running in a cluster and no kubeconfig ({where} not found)"
    )


@dataclasses.dataclass
class ClusterConfig:
    """A loaded client configuration (`kubernetes.client` or `kubernetes.aio.client`)."""

    configuration: Any
    in_cluster: bool
    context_namespace: str | None  # the kubeconfig's current context's namespace
    service_account_dir: Path

    @property
    def host(self) -> str:
        return self.configuration.host

    def namespace(self, configured: str = "") -> str:
        """The configured namespace, else the pod's own, else the kubeconfig context's, else
        'default' (what kubectl would use): jobs, notebooks and the controller agree."""
        if configured:
            return configured
        if self.in_cluster:
            try:
                own = (self.service_account_dir / "namespace").read_text().strip()
            except OSError:
                own = ""
            if own:
                return own
        return self.context_namespace or "default"


def _config_errors() -> tuple[type[BaseException], ...]:
    from kubernetes.config.config_exception import ConfigException

    return (ConfigException, OSError, TypeError, ValueError, KeyError)


def _context_namespace(files: str) -> str | None:
    from kubernetes import config

    _, current = config.list_kube_config_contexts(config_file=files)
    return ((current or {}).get("context") or {}).get("namespace")


def _unusable(files: str, exc: BaseException) -> ClusterUnavailable:
    source = f"the kubeconfig {files}" if files else "the pod's service account"
    return ClusterUnavailable(f"{NO_CLUSTER}: {source} cannot be used ({exc})")


@contextlib.contextmanager
def _unusable_on_error(files: str) -> Iterator[None]:
    try:
        yield
    except _config_errors() as exc:
        raise _unusable(files, exc) from None


def _resolve_config(
    client_module: Any, config_module: Any, kubeconfig: str, service_account_dir: Path
) -> tuple[Any, ClusterConfig | None, str]:
    """A fresh client Configuration, with the in-cluster settings already loaded when no
    kubeconfig applies, else the kubeconfig files to load (os.pathsep-joined). Shared by the
    blocking and the asyncio loaders, whose modules differ only in load_kube_config being async."""
    configuration = client_module.Configuration()
    with _unusable_on_error(""):
        if not _uses_kubeconfig(kubeconfig, service_account_dir):
            config_module.incluster_config.InClusterConfigLoader(
                token_filename=str(service_account_dir / "token"),
                cert_filename=str(service_account_dir / "ca.crt"),
            ).load_and_set(configuration)
            return configuration, ClusterConfig(configuration, True, None, service_account_dir), ""
        files = os.pathsep.join(kubeconfig_files(kubeconfig))
    if not files:
        raise _no_kubeconfig(kubeconfig)
    return configuration, None, files


def _from_kubeconfig(configuration: Any, files: str, service_account_dir: Path) -> ClusterConfig:
    with _unusable_on_error(files):
        return ClusterConfig(configuration, False, _context_namespace(files), service_account_dir)


def load_config(
    kubeconfig: str = "", service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> ClusterConfig:
    """The blocking client's configuration; ClusterUnavailable (NO_CLUSTER ...) if none."""
    from kubernetes import client, config

    configuration, ready, files = _resolve_config(client, config, kubeconfig, service_account_dir)
    if ready is None:
        with _unusable_on_error(files):
            config.load_kube_config(
                config_file=files, client_configuration=configuration, persist_config=False
            )
        ready = _from_kubeconfig(configuration, files, service_account_dir)
    # No hidden retries under ours: urllib3 would otherwise retry each failed request three
    # times at once, logging a warning each time (an outage's log noise), before our one
    # backoff policy even sees the failure.
    ready.configuration.retries = 0
    return ready


async def load_config_async(
    kubeconfig: str = "", service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> ClusterConfig:
    """The same, for the asyncio client (`kubernetes.aio`)."""
    from kubernetes.aio import client, config

    configuration, ready, files = _resolve_config(client, config, kubeconfig, service_account_dir)
    if ready is not None:
        return ready
    with _unusable_on_error(files):
        await config.load_kube_config(
            config_file=files, client_configuration=configuration, persist_config=False
        )
    return _from_kubeconfig(configuration, files, service_account_dir)


def configuration_problem(kubeconfig: str = "") -> str | None:
    """Why no cluster can be tried (NO_CLUSTER ...), or None if one is configured."""
    try:
        load_config(kubeconfig)
    except ClusterUnavailable as exc:
        return str(exc)
    return None
