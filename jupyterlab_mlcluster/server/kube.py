"""The server's connection to a Kubernetes cluster, if it has one.

Found the way kubectl finds it: the pod's service account when the server runs in a cluster,
else the kubeconfig (`$KUBECONFIG`, else `~/.kube/config`). Looked for again now and then, so
a cluster configured after the server started is picked up. Every call here blocks: run them
in an executor or a thread of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..backends.kubernetes.client import SERVICE_ACCOUNT_DIR, in_cluster, resolve_namespace

NO_CLUSTER = "no Kubernetes cluster is configured"


class ClusterUnavailable(RuntimeError):
    """No usable Kubernetes cluster; the message says why (starting with NO_CLUSTER when
    none is configured at all)."""


class KubernetesApiError(RuntimeError):
    """The API server refused a request (e.g. RBAC); the message carries its reason."""


def kubeconfig_files() -> list[str]:
    """The kubeconfig files in use ($KUBECONFIG, else ~/.kube/config) that exist. Read at
    each call: the kubernetes package reads $KUBECONFIG only once, when imported."""
    paths = [p for p in os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep) if p]
    return [str(Path(p).expanduser()) for p in paths if Path(p).expanduser().is_file()]


def kubernetes_problem() -> str | None:
    """Why this server cannot reach a Kubernetes cluster, or None if it can try."""
    if in_cluster():
        return None
    files = kubeconfig_files()
    if not files:
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        return f"{NO_CLUSTER}: this server is not running in a cluster and has no kubeconfig ({where} not found)"
    try:
        from kubernetes import client, config

        config.load_kube_config(
            config_file=os.pathsep.join(files), client_configuration=client.Configuration()
        )
    except Exception as exc:  # noqa: BLE001 - any reason the kubeconfig is unusable
        return f"{NO_CLUSTER}: the kubeconfig {os.pathsep.join(files)} cannot be used ({exc})"
    return None


def api_message(exc: Any) -> str:
    """The API server's own words from an ApiException (its Status message), else the reason."""
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.reason)


def root_cause(exc: BaseException) -> str:
    """The innermost reason of a connection failure ("[Errno 111] Connection refused"), not
    urllib3's wrappers, whose words carry object addresses that differ at every attempt."""
    while True:
        inner = getattr(exc, "reason", None)
        inner = inner if isinstance(inner, BaseException) else exc.__cause__
        if inner is None:
            return str(exc) or type(exc).__name__
        exc = inner


class KubeConnection:
    """API clients for the cluster, or ClusterUnavailable with the reason there is none."""

    PROBE_TTL = 10.0

    def __init__(self, namespace: str = ""):
        self.configured_namespace = namespace
        self._lock = threading.Lock()
        self._probed = 0.0
        self._problem: str | None = None
        self._client: Any = None

    def problem(self) -> str | None:
        """Why there is no cluster (looked for again after PROBE_TTL seconds), or None."""
        with self._lock:
            if time.monotonic() - self._probed > self.PROBE_TTL:
                self._probed = time.monotonic()
                self._problem = kubernetes_problem()
                self._client = None
            return self._problem

    def api_client(self) -> Any:
        """The shared `kubernetes.client.ApiClient` for short requests."""
        problem = self.problem()
        if problem:
            raise ClusterUnavailable(problem)
        with self._lock:
            if self._client is None:
                self._client = self.new_api_client()
            return self._client

    def new_api_client(self) -> Any:
        """An ApiClient of its own (its own connections), e.g. for a long-running watch."""
        from kubernetes import client, config

        configuration = client.Configuration()
        if in_cluster():
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(
                config_file=os.pathsep.join(kubeconfig_files()),
                client_configuration=configuration,
            )
        return client.ApiClient(configuration)

    def forget(self) -> None:
        """Look for the cluster again at the next call (it could not be reached)."""
        with self._lock:
            self._probed = 0.0

    def namespace(self) -> str:
        """The configured namespace, else this pod's, else the kubeconfig context's, else
        'default' (the Kubernetes backend's rule, so jobs and notebooks agree)."""
        context_namespace = None
        if not self.configured_namespace and not in_cluster():
            with contextlib.suppress(Exception):
                from kubernetes import config

                _, active = config.list_kube_config_contexts(
                    config_file=os.pathsep.join(kubeconfig_files())
                )
                context_namespace = ((active or {}).get("context") or {}).get("namespace")
        return resolve_namespace(
            self.configured_namespace,
            service_account_dir=SERVICE_ACCOUNT_DIR if in_cluster() else None,
            context_namespace=context_namespace,
        )

    @contextlib.contextmanager
    def errors(self, passing: tuple[int, ...] = ()) -> Iterator[None]:
        """API failures -> KubernetesApiError, or ClusterUnavailable when the API server cannot
        be reached; ApiExceptions with a status in `passing` reach the caller as they are."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as exc:
            if exc.status in passing:
                raise
            raise KubernetesApiError(
                f"the Kubernetes API refused the request: {exc.status} {api_message(exc)}"
            ) from None
        except (HTTPError, OSError) as exc:
            self.forget()
            client = self._client
            where = f" at {client.configuration.host}" if client is not None else ""
            raise ClusterUnavailable(
                f"the Kubernetes API server{where} cannot be reached: {root_cause(exc)}"
            ) from None
